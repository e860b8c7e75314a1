"""Rewrite docs/config.md's generated tables after a schema or key-table change.

``schema_markdown()`` is everything from the "### top level" heading to the end of the "## Fields"
section; ``dialects.table_markdown()`` runs from "### Graph-mode keys read into the schema's keys"
to the "## Fields" heading. tests/test_config.py and tests/test_mindformers_configs.py check both.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.training import schema_markdown  # noqa: E402
from mindformers_core.training.dialects import table_markdown  # noqa: E402


def replace_between(text: str, start: str, end: str, new: str) -> str:
    i = text.index(start)
    j = text.index(end, i) if end else len(text)
    return text[:i] + new.rstrip("\n") + "\n\n" + text[j:] if end else text[:i] + new.rstrip("\n") + "\n"


def main() -> None:
    path = os.path.join(ROOT, "docs", "config.md")
    with open(path) as f:
        text = f.read()
    text = replace_between(text, "### Graph-mode keys read into the schema's keys", "## Fields", table_markdown())
    fields = text.index("## Fields")
    head, tail = text[:fields], text[fields:]
    tail = replace_between(tail, "### top level", "\n## " if "\n## " in tail[3:] else "", schema_markdown())
    with open(path, "w") as f:
        f.write(head + tail)


if __name__ == "__main__":
    main()
