"""Generate the blocking twins of pgdq's async modules and async tests.

The async code is the source of truth, as in psycopg (its
tools/async_to_sync.py). Each pair of TWINS, and every
tests/test_*_async.py (written to tests/test_*.py), is parsed with
ast_comments (comments survive), its syntax tree turned into blocking code
(async def, async with and async for lose their `async`, `await x` becomes
`x`, names are renamed through ASYNC_TO_SYNC), its imports sorted and the
whole formatted by ruff. Asyncio calls go through pgdq/_compat.py, whose
async helpers (aspawn, asleep, AEvent...) have blocking twins there.
`--check` writes nothing and exits 1 when any generated file is out of date
(make test runs it); a run writes each file whole or not at all.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ast_comments  # type: ignore[import-untyped]  # no type information shipped

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "pgdq"
TESTS = ROOT / "tests"

# source -> (target, the target's docstring, or None: the source's, renamed)
TWINS = {
    PACKAGE / "_async_queue.py": (
        PACKAGE / "_sync_queue.py",
        "Queue: one queue of pgdq, over psycopg 3 (blocking).\n\n"
        "Generated from _async_queue.py; edit that file, then run `make sync-code`.\n",
    ),
    PACKAGE / "_async_cron.py": (
        PACKAGE / "_sync_cron.py",
        "CronService: recurring messages from Python, a daemon thread per schedule.\n\n"
        "Generated from _async_cron.py; edit that file, then run `make sync-code`.\n",
    ),
}

# Every name that differs between an async module and its twin: identifiers,
# attributes, imported modules and names, and whole words of docstrings and
# comments. Keep it one map for every pair.
ASYNC_TO_SYNC = {
    # psycopg, psycopg_pool and the standard library
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    # pgdq._compat: an asyncio call and its blocking twin
    "AEvent": "Event",
    "AWorker": "Worker",
    "agather": "gather",
    "aspawn": "spawn",
    "asleep": "sleep",
    "wait_timeout": "wait",
    # pgdq's own modules and classes
    "_async_queue": "_sync_queue",
    "_async_cron": "_sync_cron",
    "AsyncQueue": "Queue",
    "AsyncClient": "Client",
    "_AsyncBase": "_Base",
    "AsyncDelivery": "Delivery",
    "AsyncSource": "Source",
    "AsyncCronService": "CronService",
    "AsyncCronHandle": "CronHandle",
    # test fixtures
    "aq": "q",
    # prose of docstrings and comments
    "an asyncio task": "a daemon thread",
}
WORDS = re.compile(r"\b(" + "|".join(sorted(ASYNC_TO_SYNC, key=len, reverse=True)) + r")\b")


class AsyncToSync(ast.NodeTransformer):
    """The syntax tree of an async module rewritten as its blocking twin."""

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:  # noqa: N802 - ast's names
        """async def f -> def f (renamed like any def)."""
        return self._same_fields(node, ast.FunctionDef)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:  # noqa: N802
        """async with -> with."""
        return self._same_fields(node, ast.With)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:  # noqa: N802
        """async for -> for."""
        return self._same_fields(node, ast.For)

    def visit_Await(self, node: ast.Await) -> ast.AST:  # noqa: N802
        """await x -> x."""
        value: ast.AST = self.visit(node.value)
        return value

    def visit_Name(self, node: ast.Name) -> ast.Name:  # noqa: N802
        """A variable, function or class name, renamed."""
        node.id = ASYNC_TO_SYNC.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        """A parameter (a test's fixture, say), renamed."""
        node.arg = ASYNC_TO_SYNC.get(node.arg, node.arg)
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:  # noqa: N802
        """x.attr with attr renamed."""
        node.attr = ASYNC_TO_SYNC.get(node.attr, node.attr)
        return self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:  # noqa: N802
        """from a.b import c with each part of a.b renamed (c by visit_alias);
        from test_x_async import c (another async test's helpers) -> from test_x import c."""
        node.module = node.module and ".".join(ASYNC_TO_SYNC.get(part, part) for part in node.module.split("."))
        if node.module and re.fullmatch(r"test_\w+_async", node.module):
            node.module = node.module.removesuffix("_async")
        return self.generic_visit(node)

    def visit_alias(self, node: ast.alias) -> ast.alias:
        """An imported name, renamed."""
        node.name = ASYNC_TO_SYNC.get(node.name, node.name)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:  # noqa: N802
        """def f with f renamed."""
        node.name = ASYNC_TO_SYNC.get(node.name, node.name)
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:  # noqa: N802
        """class C with C renamed."""
        node.name = ASYNC_TO_SYNC.get(node.name, node.name)
        return self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:  # noqa: N802
        """A string (docstrings included) with its async words renamed."""
        if isinstance(node.value, str):
            node.value = _rename_words(node.value)
        return node

    def visit_Comment(self, node: Any) -> Any:  # noqa: N802 - ast_comments' node
        """A comment with its async words renamed."""
        node.value = _rename_words(node.value)
        return node

    def _same_fields(self, node: ast.AST, kind: type[ast.AST]) -> ast.AST:
        """node as a node of kind with the same fields, its children rewritten."""
        twin = kind(**{name: getattr(node, name) for name in node._fields})
        rewritten: ast.AST = self.visit(ast.copy_location(twin, node))
        return rewritten


def _rename_words(text: str) -> str:
    """text with every whole word that is an async name of ASYNC_TO_SYNC replaced."""
    return WORDS.sub(lambda m: ASYNC_TO_SYNC[m.group(0)], text)


def twins() -> dict[Path, tuple[Path, str | None]]:
    """Every async source -> (its generated target, the target's docstring or None)."""
    tests = sorted(TESTS.glob("test_*_async.py"))
    return TWINS | {source: (source.with_name(source.name.removesuffix("_async.py") + ".py"), None) for source in tests}


def generate(source: Path, target: Path, docstring: str | None) -> str:
    """The blocking twin of source (to be written to target): imports sorted, formatted by ruff."""
    tree = AsyncToSync().visit(ast_comments.parse(source.read_text()))
    first = tree.body[0]
    if docstring is not None:
        assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant), f"{source} has no docstring"
        first.value.value = docstring
    header = f"# GENERATED by python/tools/gen_sync.py from {source.name}: DO NOT EDIT.\n"
    code = header + ast_comments.unparse(tree) + "\n"
    # sort the renamed imports; drop the parentheses unparse puts around a lone generator argument
    code = _ruff(["check", "--fix-only", "--select", "I,UP034", "--exit-zero"], target, code)
    return _ruff(["format"], target, code)


def _ruff(command: list[str], target: Path, code: str) -> str:
    """code run through `ruff <command>` with the repo's settings, as if it were target."""
    ruff = Path(sys.executable).with_name("ruff")
    config = ["--config", str(ROOT / "ruff.toml"), "--stdin-filename", str(target), "-"]
    return subprocess.run([str(ruff), *command, *config], input=code, capture_output=True, text=True, check=True).stdout


def main() -> int:
    """Write every twin that changed, or with --check exit 1 naming those out of date."""
    stale: dict[Path, str] = {}
    for source, (target, docstring) in twins().items():
        code = generate(source, target, docstring)
        if not target.exists() or target.read_text() != code:
            stale[target] = code
    if "--check" in sys.argv:
        for target in stale:
            print(f"{target.relative_to(ROOT)} is out of date: run `make sync-code`", file=sys.stderr)
        return 1 if stale else 0
    for target, code in stale.items():
        partial = target.with_name(f".{target.name}.tmp")
        partial.write_text(code)
        os.replace(partial, target)  # whole or not at all: others import it while we run
    return 0


if __name__ == "__main__":
    sys.exit(main())
