"""Make the PEP 503 wheel index: one simple index per torch x CUDA variant.

    python scripts/make_index.py --wheels wheelhouse --out site [--base-url URL] [--manifest-in old.json]

Each wheel's variant comes from its build tag (2110.130 -> torch2.11-cu130); the site gets

    site/index.html                                  the variants, with the pip command
    site/torch2.11-cu130/index.html                  PEP 503 root: the project list
    site/torch2.11-cu130/sageattention/index.html    the wheels, href ending in #sha256=...
    site/manifest.json                               every wheel listed (carried to the next release)

so that `pip install sageattention --extra-index-url <site>/torch2.11-cu130/` sees only the
wheels built for torch 2.11 + CUDA 13.0. With --base-url the links point there (a release's
download URL); without it the wheels are copied to site/files/ and linked relatively.
--manifest-in adds the wheels of earlier releases (their URLs and hashes), so the published
index keeps every version.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import shutil
import sys
from typing import Dict, List, Optional

from packaging.utils import canonicalize_name, parse_wheel_filename

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matrix  # noqa: E402


def variant_of(filename: str) -> str:
    """'sageattention-2.2.0-2110.130-cp310-abi3-....whl' -> 'torch2.11-cu130'."""
    _, _, build, _ = parse_wheel_filename(filename)
    if not build:
        raise ValueError(f"{filename}: no build tag, so no torch/CUDA variant")
    torch_digits, cuda_digits = str(build[0]), build[1].lstrip(".")
    # the build tag is matrix.build_tag(): torch major, minor, patch (one digit) . CUDA major, minor
    if len(torch_digits) < 3 or len(cuda_digits) < 2 or not cuda_digits.isdigit():
        raise ValueError(f"{filename}: build tag {build[0]}{build[1]} is not <torch>.<cuda>")
    torch = f"{torch_digits[0]}.{torch_digits[1:-1]}.{torch_digits[-1]}"
    cuda = f"{cuda_digits[:-1]}.{cuda_digits[-1]}"
    return matrix.variant(torch, cuda)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def collect(wheel_dir: str, base_url: Optional[str]) -> List[Dict[str, str]]:
    out = []
    for name in sorted(os.listdir(wheel_dir)):
        if not name.endswith(".whl"):
            continue
        path = os.path.join(wheel_dir, name)
        entry = {"filename": name, "sha256": sha256(path), "variant": variant_of(name)}
        entry["url"] = (base_url.rstrip("/") + "/" + name) if base_url else f"../../files/{name}"
        entry["path"] = path
        out.append(entry)
    return out


def _page(title: str, body: List[str]) -> str:
    return ("<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.0\">\n"
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            + "".join(f"    {line}\n" for line in body) + "  </body>\n</html>\n")


def write_site(entries: List[Dict[str, str]], out: str) -> Dict[str, List[str]]:
    by_variant: Dict[str, Dict[str, Dict[str, str]]] = {}
    for e in entries:
        by_variant.setdefault(e["variant"], {})[e["filename"]] = e  # a newer entry for a file wins
    os.makedirs(out, exist_ok=True)
    for e in entries:
        if e.get("path") and e["url"].startswith("../../files/"):
            os.makedirs(os.path.join(out, "files"), exist_ok=True)
            shutil.copy2(e["path"], os.path.join(out, "files", e["filename"]))
    project = canonicalize_name("sageattention")
    listing = {}
    for var, files in sorted(by_variant.items()):
        pdir = os.path.join(out, var, project)
        os.makedirs(pdir, exist_ok=True)
        links = [f'<a href="{html.escape(f["url"])}#sha256={f["sha256"]}">{html.escape(name)}</a><br>'
                 for name, f in sorted(files.items())]
        with open(os.path.join(pdir, "index.html"), "w") as fh:
            fh.write(_page(f"Links for {project}", links))
        with open(os.path.join(out, var, "index.html"), "w") as fh:
            fh.write(_page(f"sageattention wheels for {var}", [f'<a href="{project}/">{project}</a><br>']))
        listing[var] = sorted(files)
    rows = [f'<li><a href="{v}/">{v}</a>: <code>pip install sageattention --extra-index-url '
            f'&lt;this site&gt;/{v}/</code> ({len(files)} wheels)</li>' for v, files in sorted(listing.items())]
    with open(os.path.join(out, "index.html"), "w") as fh:
        fh.write(_page("sageattention wheel index", ["<p>One index per torch and CUDA: pick the one matching "
                                                    "<code>python -c \"import torch; print(torch.__version__, "
                                                    "torch.version.cuda)\"</code>.</p>", "<ul>"] + rows + ["</ul>"]))
    manifest = [{k: e[k] for k in ("filename", "sha256", "variant", "url")}
                for files in by_variant.values() for e in files.values()]
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(sorted(manifest, key=lambda e: e["filename"]), fh, indent=1)
    return listing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Make the per torch x CUDA PEP 503 index of a folder of wheels.")
    ap.add_argument("--wheels", required=True, help="folder with the .whl files")
    ap.add_argument("--out", required=True, help="site folder to write")
    ap.add_argument("--base-url", help="URL the wheels are downloaded from (default: copy them into the site)")
    ap.add_argument("--manifest-in", help="manifest.json of the previous index: keep its wheels")
    args = ap.parse_args(argv)
    entries = []
    if args.manifest_in and os.path.exists(args.manifest_in):
        with open(args.manifest_in) as fh:
            entries = json.load(fh)
    try:
        entries += collect(args.wheels, args.base_url)
    except ValueError as exc:
        print(f"make_index: {exc}", file=sys.stderr)
        return 1
    for var, files in write_site(entries, args.out).items():
        print(f"{var}: {len(files)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
