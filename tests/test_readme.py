"""The README runs as shown: every fenced code block, in the state `make demo`
leaves (DATABASE_URL naming a database with pgdq, .venv's python and pgdq
first on PATH, the checkout as working directory).

All blocks run in one fresh database, as a reader's would: the SQL blocks
first, then the Python, then the shell, each language in the README's order
(a block may use what an earlier one of its language made, and must cope
with what the others left). ```sql blocks run with `psql -X -v
ON_ERROR_STOP=1`, ```python blocks in one interpreter (one namespace;
tracebacks give README line numbers), ```sh blocks with `bash -e -o
pipefail`. An HTML comment right above a block changes that:
`<!-- not run: why -->` skips it (reported as a skipped test with the
reason), `<!-- runs until stopped: … -->` runs it alone, requires it to be
still running after 3 s, then sends SIGTERM and expects exit 0. A block in
any other language (or none) fails the test: say what it is. The README's
layout table must name real files, every module of python/pgdq, and its
relative links must lead somewhere."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from conftest import DB, install_extension, recreate_database
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the README's walk-through goes on in docs/ (in reading order), then the package's own
# readme (python/pyproject.toml ships it): their blocks run after README.md's
WALKTHROUGH_DOCS = ("python", "guide", "cli", "install", "production", "development")
READMES = (README, *(ROOT / "docs" / f"{name}.md" for name in WALKTHROUGH_DOCS), ROOT / "python/README.md")
# the layout table of the repository
LAYOUT = ROOT / "docs/development.md"
LANGUAGES = {"sql": "sql", "python": "python", "sh": "sh", "bash": "sh", "console": "sh"}
# a hang guard, not a time limit: the blocks run dozens of commands, slow on a busy machine
BLOCKS_TIMEOUT = 900
pytestmark = pytest.mark.timeout(BLOCKS_TIMEOUT)
STARTED = "pgdq worker starting"  # the line a "runs until stopped" block prints once it runs
STOPPED = "pgdq worker stopped cleanly"  # and the line it prints when SIGTERM stopped it


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, first code line (1-based), code, and
    the HTML comments right above its fence."""

    path: str  # relative to the checkout
    language: str
    line: int
    code: str
    notes: tuple[str, ...]

    @property
    def skip_reason(self) -> str | None:
        """Why the block is not run, if a `<!-- not run… -->` note says so."""
        for note in self.notes:
            if note.startswith("<!-- not run"):
                return note.removeprefix("<!--").removesuffix("-->").strip()
        return None

    @property
    def runs_until_stopped(self) -> bool:
        return any(note.startswith("<!-- runs until stopped") for note in self.notes)

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.language})"


def readme_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        fence = re.fullmatch(r"```(\S*)\s*", lines[index])
        if fence is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        notes: list[str] = []
        above = index - 1
        while above >= 0 and lines[above].startswith("<!--"):
            notes.insert(0, lines[above])
            above -= 1
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(str(path.relative_to(ROOT)), fence.group(1), index + 2, code, tuple(notes)))
        index = end + 1
    return found


BLOCKS = [block for path in READMES for block in readme_blocks(path)]
# the first SQL block: the walk-through `make demo`'s next steps lead to, whose output is checked
WALKTHROUGH = next(b for b in BLOCKS if b.path == "README.md" and b.language == "sql" and b.skip_reason is None)


def runnable(language: str) -> list[Block]:
    """The blocks of a language run in order together."""
    return [
        b
        for b in BLOCKS
        if LANGUAGES.get(b.language) == language and b.skip_reason is None and not b.runs_until_stopped
    ]


# -- the state `make demo` leaves ---------------------------------------------------------


def conninfo(dbname: str) -> str:
    """A DSN naming everything (as make demo prints one): the PG* variables' server."""
    parts = {"dbname": dbname}
    for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER")):
        if os.environ.get(var):
            parts[key] = os.environ[var]
    return psycopg.conninfo.make_conninfo(**parts)


@pytest.fixture(scope="module")
def demo_env(database: str) -> Iterator[dict[str, str]]:
    """A fresh database with pgdq, and the environment make demo's next steps
    set up: DATABASE_URL and .venv first on PATH (the shell's PG* are dropped,
    so the blocks use DATABASE_URL alone). One for the whole README, as a
    reader has: the languages run one after the other in it."""
    name = f"{DB}_readme"
    recreate_database(name)
    with psycopg.connect(conninfo(name), autocommit=True) as conn:
        install_extension(conn)
    env = {k: v for k, v in os.environ.items() if not re.fullmatch(r"PG[A-Z]+|PGDQ_\w+|DATABASE_URL", k)}
    venv = Path(sys.executable).parent
    env.update(
        DATABASE_URL=conninfo(name), PATH=f"{venv}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv.parent)
    )
    yield env
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def run(args: list[str], env: dict[str, str], what: object, stdin: str | None = None) -> str:
    """Run a command in the checkout; its output, or a failure naming what it runs. No time limit of
    its own: a block of 25 commands took over 2 minutes on a busy machine (make test's jobs at once),
    and a hang is caught by the test's timeout (BLOCKS_TIMEOUT)."""
    done = subprocess.run(args, cwd=ROOT, env=env, input=stdin, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{what} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    return str(done.stdout)


@pytest.fixture(scope="module")
def after_make_demo(demo_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The environment of demo_env on another fresh database as `make demo`
    leaves it: examples/demo.py run there, then the next steps it prints
    (scripts/demo.sh --next-steps) but the export and source lines (set up
    here) and those that run until Ctrl-C."""
    name = f"{DB}_readme_demo"
    recreate_database(name)
    env = {**demo_env, "DATABASE_URL": conninfo(name)}
    run([sys.executable, "examples/demo.py"], env, "examples/demo.py")
    steps = run(["bash", "scripts/demo.sh", "--next-steps", env["DATABASE_URL"]], env, "scripts/demo.sh --next-steps")
    commands = [line.strip() for line in steps.splitlines() if line.startswith("  ")]
    assert commands, f"scripts/demo.sh --next-steps printed no steps:\n{steps}"
    for command in commands:
        if not re.match(r"(export|source) ", command) and "Ctrl-C" not in command:
            run(["bash", "-e", "-o", "pipefail", "-c", command], env, f"the next step {command!r}")
    yield env
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def a_reader_later(env: dict[str, str], minutes: int) -> dict[str, str]:
    """env with the database clock (dq.now) `minutes` ahead: a reader who paused."""
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        row = conn.execute("SELECT (clock_timestamp() + make_interval(mins => %s))::text", (minutes,)).fetchone()
    assert row is not None
    return {**env, "PGOPTIONS": f"-c dq.now={row[0].replace(' ', 'T')}"}


def test_walkthrough_prints_what_it_documents_after_make_demo(after_make_demo: dict[str, str], tmp_path: Path) -> None:
    """The walk-through where `make demo` and its next steps left their
    messages, the Python run five minutes after the SQL (a reader's pace)."""
    run_sql(WALKTHROUGH, after_make_demo)
    run_python(a_reader_later(after_make_demo, 5), tmp_path)


# -- the blocks ---------------------------------------------------------------------------


def run_sql(block: Block, env: dict[str, str]) -> None:
    """Run a SQL block with psql; for the walk-through, check what it documents."""
    psql = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", env["DATABASE_URL"]]
    if block is not WALKTHROUGH:
        run(psql, env, block, block.code)
        return
    marked, documented = walkthrough_script(block)
    output = run([*psql, "-t", "-A"], env, block, marked)
    printed = {int(m[1]): m[2].strip() for m in re.finditer(r"^@@ (\d+)\n(.*?)(?=^@@ |\Z)", output, re.M | re.S)}
    for line, (statement, expected) in documented.items():
        got = printed.get(statement, "").split()
        assert got[:1] == [expected], (
            f"README.md:{block.line + line}: documents {expected!r} for line {block.line + statement}, "
            f"which printed {printed.get(statement)!r}"
        )


def walkthrough_script(block: Block) -> tuple[str, dict[int, tuple[int, str]]]:
    """The block with a marker echoed before each statement (numbered by its
    line in the block), and what the block documents: for a `--  value`
    line right below a statement, the statement's line and the value (the
    first word of what it prints)."""
    marked: list[str] = []
    documented: dict[int, tuple[int, str]] = {}
    statement = -1
    for number, line in enumerate(block.code.splitlines()):
        if result := re.match(r"--  (\S+)", line):
            if statement >= 0:
                documented[number] = (statement, result[1])
            continue
        statement = -1
        if line.strip() and not line.startswith("--"):
            statement = number
            marked.append(f"\\echo '@@ {number}'")
        marked.append(line)
    return "\n".join(marked) + "\n", documented


def test_sql_blocks(demo_env: dict[str, str]) -> None:
    blocks = runnable("sql")
    assert blocks, "the README has SQL to run"
    for block in blocks:
        run_sql(block, demo_env)


# Runs the READMEs' Python blocks in one namespace, each compiled at its line
# of its file so that a traceback points there.
PYTHON_DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for path, line, code in json.load(open(sys.argv[1])):
    print(f"--- {path}:{line}", flush=True)
    exec(compile("\\n" * (line - 1) + code, path, "exec"), namespace)
"""


def run_python(env: dict[str, str], tmp_path: Path) -> None:
    """Run the READMEs' Python blocks in one interpreter; check what the
    walk-through documents it prints (`print("handling", …)  # key payload`)."""
    blocks = runnable("python")
    assert blocks, "the README has Python to run"
    script = tmp_path / "blocks.json"
    script.write_text(json.dumps([[b.path, b.line, b.code] for b in blocks]))
    output = run([sys.executable, "-c", PYTHON_DRIVER, str(script)], env, "the READMEs' python blocks")
    documented = [
        f"{m[1]} {m[2]}"
        for b in blocks
        if b.path == "README.md"
        for m in re.finditer(r'^\s*print\("([^"]+)", .*\)\s+#\s*(.*?)\s*$', b.code, re.M)
    ]
    assert documented, "the walk-through documents what its Python prints"
    for expected in documented:
        assert expected in output.splitlines(), f"the README documents {expected!r}; the blocks printed:\n{output}"


def test_python_blocks(demo_env: dict[str, str], tmp_path: Path) -> None:
    run_python(demo_env, tmp_path)


def test_shell_blocks(demo_env: dict[str, str]) -> None:
    blocks = runnable("sh")
    assert blocks, "the README has shell commands to run"
    for block in blocks:
        run(["bash", "-e", "-o", "pipefail", "-c", block.code], demo_env, block)


def long_running() -> list[Block]:
    return [b for b in BLOCKS if b.runs_until_stopped and b.skip_reason is None]


@pytest.mark.parametrize("block", long_running(), ids=str)
def test_blocks_that_run_until_stopped(block: Block, demo_env: dict[str, str], tmp_path: Path) -> None:
    if LANGUAGES.get(block.language) == "python":
        script = tmp_path / "block.py"  # padded: a traceback's line numbers are the README's
        script.write_text("\n" * (block.line - 1) + block.code)
        args = [sys.executable, str(script)]
    else:
        args = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    process = subprocess.Popen(
        args,
        cwd=ROOT,
        env=demo_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        printed = []
        for line in process.stdout:  # until it says it runs (pytest-timeout ends a silent hang)
            printed.append(line)
            if STARTED in line:
                break
        else:
            raise AssertionError(f"{block} ended (exit {process.wait()}) before {STARTED!r}:\n{''.join(printed)}")
        os.killpg(process.pid, signal.SIGTERM)
        output = "".join(printed) + process.communicate()[0]
        assert process.returncode == 0, f"{block}: exit {process.returncode} after SIGTERM:\n{output}"
        assert STOPPED in output, f"{block} did not say it stopped cleanly:\n{output}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.skip_reason], ids=str)
def test_blocks_not_run_say_why(block: Block) -> None:
    """Reported as skipped, with the README's reason (pytest -rs lists them)."""
    assert len(block.skip_reason or "") > len("not run: "), f"{block}: say why it is not run"
    pytest.skip(f"{block}: {block.skip_reason}")


def test_every_block_is_code_the_test_knows() -> None:
    unknown = [str(b) for b in BLOCKS if b.language not in LANGUAGES]
    assert not unknown, f"blocks in no language the test runs (label them sql, python or sh): {unknown}"
    assert runnable("sql") and runnable("python") and runnable("sh")


# -- what the README says about the repository --------------------------------------------


def layout_section() -> str:
    text = LAYOUT.read_text()
    return text.split("## Layout", 1)[1].split("\n## ", 1)[0]


def layout_paths(cell: str) -> list[str]:
    """The paths a layout cell names; a bare name in parentheses after a
    directory (`python/pgdq/cli/` (`_base.py`, …)) is in that directory."""
    paths: list[str] = []
    for directory, inside, path in re.findall(r"`([^`\s]+/)` \(([^)]*)\)|`([^`\s]+)`", cell):
        if directory:
            paths += [directory, *(directory + name for name in re.findall(r"`([^`\s]+)`", inside))]
        else:
            paths.append(path)
    return paths


def test_layout_names_real_files_and_every_module() -> None:
    table = [line for line in layout_section().splitlines() if line.startswith("| `")]
    paths = [p for line in table for p in layout_paths(line.split(" | ")[0])]
    missing = [p for p in paths if not list(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"the README's layout names paths that do not exist: {missing}"
    named = set(paths)
    modules = sorted(str(m.relative_to(ROOT)) for m in (ROOT / "python/pgdq").glob("*.py") if m.name != "__init__.py")
    unnamed = [m for m in modules if m not in named]
    assert not unnamed, f"the README's layout does not name these modules: {unnamed}"


def test_relative_links_lead_somewhere() -> None:
    for readme in READMES:
        links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme.read_text())
        broken = [t for t in links if "://" in t or not (readme.parent / t).exists()]
        assert not broken, f"links in {readme.relative_to(ROOT)} that lead outside the repository or nowhere: {broken}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (not - or _), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_docs_reach_their_files_and_headings() -> None:
    """Every relative link of the READMEs and docs/*.md leads to a file, and a #part of a
    Markdown file to one of its headings (a newcomer following [Installing](install.md#installing)
    landed at the top of a page with no such heading)."""
    pages = sorted({*READMES, *(ROOT / "docs").glob("*.md")})
    broken = []
    for page in pages:
        for target, part in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target) if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif part and path.suffix == ".md":
                text = path.read_text()
                anchors = {_slug(h) for h in re.findall(r"^#+ +(.*)$", text, re.M)}
                anchors |= set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
                if part not in anchors:
                    broken.append(f"{page.relative_to(ROOT)}: {target}#{part}")
    assert not broken, f"links that lead nowhere: {broken}"
