"""The docs and the code's comments name only what exists.

Every ``cartonstore/...`` path and every ``cartonstore.x.y`` dotted name
in the README, docs/ and the comments and docstrings of cartonstore/
resolves in this tree; a path written relative to a package folder
(``runners/instance.py``) is a file of that folder; and nothing cites an
issue number in place of a reason. Dotted names resolve without importing
anything but the modules they name, and attributes through those modules.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "cartonstore"

DOTTED = re.compile(r"(?<![\w./-])cartonstore(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])cartonstore/(?:\w+/)*(?:\w+\.py\b|(?=[\s`'\"),:;]))")
RELATIVE = re.compile(r"(?<![\w./-])(?:\w+/)+\w+\.py\b")
ISSUE = re.compile(r"\bissues? #?\d+", re.I)

# Names of the cartonstore. form that are not Python: files the daemon and
# the units make, and the tensor arena's shared-memory region.
NOT_MODULES = {"cartonstore.sock", "cartonstore.grpc.sock", "cartonstore.toml", "cartonstore.service",
               "cartonstore.socket", "cartonstore.sysusers", "cartonstore.conf", "cartonstore.arena"}

def comments_and_docstrings(path: Path) -> str:
    text = path.read_text()
    parts = [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(parts)


def documents() -> dict[str, str]:
    """What is read, by path: the docs whole, the code's prose only."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    read = {str(p.relative_to(REPO)): p.read_text() for p in docs}
    read.update({str(p.relative_to(REPO)): comments_and_docstrings(p) for p in sorted(PACKAGE.rglob("*.py"))})
    return read


DOCUMENTS = documents()
FOLDERS = {p.name for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}
FILES = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")]


def found(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted({(match, where) for where, text in DOCUMENTS.items() for match in pattern.findall(text)})


def resolves(name: str) -> bool:
    """Whether a dotted name is a package, a module, or an attribute of one."""
    parts = name.split(".")
    where, depth = REPO, 0
    while depth < len(parts) and (where / parts[depth] / "__init__.py").exists():
        where, depth = where / parts[depth], depth + 1
    if depth < len(parts) and (where / f"{parts[depth]}.py").exists():
        depth += 1
    thing: object = importlib.import_module(".".join(parts[:depth]))
    for attribute in parts[depth:]:
        if not hasattr(thing, attribute):
            return False
        thing = getattr(thing, attribute)
    return True


def test_every_cartonstore_path_exists() -> None:
    missing = [(path, where) for path, where in found(PATH)
               if not (REPO / path).exists()]
    assert not missing, missing


def test_every_path_under_a_package_folder_exists() -> None:
    """``runners/instance.py`` in a comment names a file of a folder named
    runners; a path whose first folder is no package folder (``model/main.py``
    in a carton) is not the package's."""
    missing = [(path, where) for path, where in found(RELATIVE)
               if path.split("/")[0] in FOLDERS | {"cartonstore"}
               and not any(f == path.removeprefix("cartonstore/") or f.endswith("/" + path) for f in FILES)
              ]
    assert not missing, missing


def test_every_dotted_name_resolves() -> None:
    missing = [(name, where) for name, where in found(DOTTED) if name not in NOT_MODULES and not resolves(name)]
    assert not missing, missing


def test_no_issue_numbers_are_cited() -> None:
    cited = [(match, where) for match, where in found(ISSUE) if where.startswith(("cartonstore/", "docs/", "README"))]
    assert not cited, cited


def test_no_design_document_is_cited_that_is_not_there() -> None:
    named = {(m, where) for where, text in DOCUMENTS.items() for m in re.findall(r"\b[A-Z]+\.md\b", text)}
    missing = [(name, where) for name, where in sorted(named) if not list(REPO.glob(f"**/{name}"))]
    assert not missing, missing
