"""Where the installed CANN op package's aclnn library (``libcust_opapi.so``) can be.

The same places, in the same order, as torch_npu's own lookup of custom aclnn ops
(op-plugin ``GetOpApiFuncAddr``): each ``ASCEND_CUSTOM_OPP_PATH`` entry (a
``<install>/vendors/<vendor>`` directory, which the package's ``set_env.bash`` exports
when it was installed with ``--install-path``), then the vendors listed by
``load_priority`` in ``$ASCEND_OPP_PATH/vendors/config.ini`` (a default install). The NPU
extension loads the first of these files that exports the flash-cann symbols.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

LIBRARY = Path("op_api") / "lib" / "libcust_opapi.so"


def _config_vendors(opp_path: str) -> list[str]:
    """The vendors of ``load_priority=a,b`` in ``vendors/config.ini``, in order."""
    try:
        lines = (Path(opp_path) / "vendors" / "config.ini").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "load_priority":
            return [v.strip() for v in value.split(",") if v.strip()]
    return []


def search_path(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Every place the library is looked for, in order (existing or not)."""
    places = [Path(entry) / LIBRARY
              for entry in environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if entry]
    opp_path = environ.get("ASCEND_OPP_PATH", "")
    if opp_path:
        places += [Path(opp_path) / "vendors" / vendor / LIBRARY
                   for vendor in _config_vendors(opp_path)]
    return places


def candidates(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The existing files of :func:`search_path`, without repeats."""
    return list(dict.fromkeys(str(p) for p in search_path(environ) if p.is_file()))


def describe_search(environ: Mapping[str, str] = os.environ) -> str:
    """What was searched, for an error message."""
    places = search_path(environ)
    if not places:
        return ("neither ASCEND_CUSTOM_OPP_PATH nor ASCEND_OPP_PATH (with vendors/config.ini "
                "load_priority) is set")
    return "searched " + ", ".join(str(p) for p in places)
