"""Where the user's code is: the line an error or a traced node points to."""

import linecache
import os
import sys

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__))


def user_source_line():
    """``file:line: code`` of the innermost frame outside mlsys_lab and the standard library."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_PKG_DIR) and not fn.startswith(_STDLIB_DIR):
            code = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
            return f"{os.path.basename(fn)}:{f.f_lineno}: {code}" if code else \
                f"{os.path.basename(fn)}:{f.f_lineno}"
        f = f.f_back
    return ""
