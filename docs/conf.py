"""Sphinx configuration of the torchcomms documentation (built by ``scripts/docs.sh``).

The guides are the Markdown files of this folder (read through myst-parser); the reference
under ``reference/`` is generated from the code by autodoc, which imports the packages, so
it documents what the code exports at run time (``__all__``), not what a parser can guess.
"""

from __future__ import annotations

import torchcomms_core

project = "torchcomms"
author = "the torchcomms authors"
copyright = "the torchcomms authors"  # noqa: A001 - the name Sphinx reads
release = torchcomms_core.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

# Signatures carry the annotations as written; descriptions repeat them per argument only
# where the docstring documents the argument.
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}
autodoc_preserve_defaults = True
# Google-style sections (Args, Returns, Raises), as in torch.distributed's docstrings.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Attributes as :ivar: fields: napoleon's `.. attribute::` entries would describe the
# same name autodoc already documents, which Sphinx reports as a duplicate.
napoleon_use_ivar = True

# Guides link into the reference with MyST's {py:func}`...` roles and to each other's
# headings with (file.md#slug); slugs up to h3 are generated for the latter.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Unresolved Python references (torch's own types, such as torch.Tensor, which torch's
# documentation owns) are not reported: nitpicky stays off.
nitpicky = False

html_theme = "furo"
html_title = f"torchcomms {release}"
html_static_path: list[str] = []


def _skip_class_aliases(
    app: object, what: str, name: str, obj: object, skip: bool, options: object
) -> bool | None:
    """Skip what is documented elsewhere: class aliases and torch's own re-exported names.

    ``ReduceOp.RedOpType`` is the reference's alias of the module-level ``RedOpType``;
    documenting it again would describe one class twice. ``torchcomms.distwrap`` re-exports
    some of ``torch.distributed``'s own classes (``ProcessGroupGloo``, ``ReduceOp``), which
    torch's documentation describes.
    """
    module = getattr(obj, "__module__", None) or ""
    if what == "module" and (isinstance(obj, type) or callable(obj)):
        if not module.split(".", 1)[0].startswith("torchcomms"):
            return True
    if what == "class" and isinstance(obj, type) and obj.__name__ == name:
        if obj.__qualname__ == obj.__name__:
            return True
    return None


def setup(app: object) -> None:
    """Register the skip rule above."""
    app.connect("autodoc-skip-member", _skip_class_aliases)  # type: ignore[attr-defined]
