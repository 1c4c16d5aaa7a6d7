"""The ``sinkattn`` console script: runs the C++ command shipped in the package (``sinkattn/bin/sinkattn``: run,
check, bench, info; README, "The command") with the same arguments, in place of this Python process (exec), so its
exit status, output and signals are the command's own. The binary finds ``libsinkattn.so`` through its RPATH
(``$ORIGIN/../lib``)."""

from __future__ import annotations

import os
import sys


def binary_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "sinkattn")


def main() -> None:
    exe = binary_path()
    if not os.access(exe, os.X_OK):
        sys.exit(f"sinkattn: {exe} is missing: this install was built from source without the command (CLI11 and "
                 "nlohmann-json were not found); install the prebuilt wheel (README, Install) or the two packages "
                 "(Debian: libcli11-dev nlohmann-json3-dev) and reinstall")
    os.execv(exe, ["sinkattn", *sys.argv[1:]])


if __name__ == "__main__":
    main()
