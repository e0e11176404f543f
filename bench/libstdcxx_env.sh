# Sourced by the device scripts that build (device_run.sh, e2e_ab.sh). The lent machine's
# compiler (/opt/gcc, a relocated bundle) finds only libstdc++.a and would link a private copy
# of it, which setup.py refuses (it crashes beside torch's shared one on any error message that
# formats a number). Point the linker at the system's libstdc++.so.6 (exports LDFLAGS).
if [[ "$(${CXX:-c++} -print-file-name=libstdc++.so)" != /* ]]; then
  _lib=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  if [[ -n "$_lib" ]]; then
    mkdir -p /tmp/sageattn-libstdcxx && ln -sf "$_lib" /tmp/sageattn-libstdcxx/libstdc++.so
    export LDFLAGS="-L/tmp/sageattn-libstdcxx${LDFLAGS:+ $LDFLAGS}"
    echo "linking the system's $_lib (the compiler has no libstdc++.so)"
  fi
  unset _lib
fi
