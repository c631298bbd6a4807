"""The docs stay true to the code: hooks documented, reference generated, examples valid,
links alive."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import yaml
from pydantic import BaseModel

from shuniu.core import hookspecs
from shuniu.core.config import model as config
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import load_plugins

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOC_FILES = sorted(DOCS.glob("*.md"))
INVALID_MARK = "# this file is invalid on purpose"
TIMES = "\N{MULTIPLICATION SIGN}"

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _blocks(path: Path) -> list[tuple[str, str]]:
    """(language, text) for every fenced code block of a Markdown file."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(path.read_text("utf-8"))]


def _deployment_blocks() -> list[tuple[str, str, str | None]]:
    """(id, yaml text, the ```text block that follows it) for every yaml block with a
    top-level ``models:`` key."""
    out = []
    for path in DOC_FILES:
        blocks = _blocks(path)
        for i, (lang, text) in enumerate(blocks):
            if lang != "yaml" or not re.search(r"^models:", text, re.MULTILINE):
                continue
            following = blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "text" else None
            out.append((f"{path.name}#{i}", text, following))
    return out


def _hookspec_names() -> list[str]:
    return sorted(
        name
        for name in dir(hookspecs)
        if callable(getattr(hookspecs, name)) and hasattr(getattr(hookspecs, name), "shuniu_spec")
    )


def _config_models() -> list[type[BaseModel]]:
    return [
        obj
        for obj in vars(config).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ in (config.__name__, "shuniu.core.config.endpoints")
    ]


@pytest.fixture(scope="module")
def plugins():
    """The built-in plugins only: the docs describe what ships with shuniu, whatever else
    happens to be installed."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHUNIU_PLUGINS", "shuniu")
        mp.delenv("SHUNIU_DISABLE_PLUGINS", raising=False)
        return load_plugins()


def test_docs_exist() -> None:
    names = {p.name for p in DOC_FILES}
    for required in (
        "index.md",
        "getting-started.md",
        "deployment.md",
        "api.md",
        "plugins.md",
        "backends.md",
        "design-choices.md",
        "simulator.md",
        "workloads.md",
    ):
        assert required in names


def test_every_hookspec_has_a_heading_in_plugins_md() -> None:
    names = _hookspec_names()
    assert len(names) >= 10, names
    text = (DOCS / "plugins.md").read_text("utf-8")
    headings = set(re.findall(r"^### (\S+)\s*$", text, re.MULTILINE))
    missing = [n for n in names if n not in headings]
    assert not missing, f"hookspecs without a '### name' heading in docs/plugins.md: {missing}"


def test_generated_reference_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(DOCS / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-4000:]


def test_every_config_field_is_in_deployment_md() -> None:
    text = (DOCS / "deployment.md").read_text("utf-8")
    models = _config_models()
    assert config.Deployment in models and config.EndpointConfig in models
    missing = [
        f"{model.__name__}.{field}"
        for model in models
        for field in model.model_fields
        if f"`{field}`" not in text
    ]
    assert not missing, f"fields not documented in docs/deployment.md: {missing}"


def test_there_are_deployment_examples() -> None:
    assert len(_deployment_blocks()) >= 4


@pytest.mark.parametrize(
    ("where", "text", "expected"), [pytest.param(*b, id=b[0]) for b in _deployment_blocks()]
)
def test_yaml_examples_validate(
    where: str, text: str, expected: str | None, plugins, tmp_path: Path, monkeypatch
) -> None:
    if INVALID_MARK not in text:
        load_deployment(None, plugins, text=text, env={})
        return
    # A deliberately broken file: it must fail, and the shown output must be the real one.
    (tmp_path / "broken.yaml").write_text(text, "utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_deployment(Path("broken.yaml"), plugins, env={})
    if expected is not None:
        exc = info.value
        shown = [f"{exc.source}: {len(exc.problems)} problem(s)", *(f"  - {p}" for p in exc.problems)]
        assert expected.strip().splitlines() == shown


def test_yaml_blocks_parse() -> None:
    for path in DOC_FILES:
        for lang, text in _blocks(path):
            if lang == "yaml":
                yaml.safe_load(text)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    prose = _FENCE.sub("", path.read_text("utf-8"))
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", prose, re.MULTILINE)}


def test_relative_links_point_to_existing_files() -> None:
    broken = []
    for path in DOC_FILES:
        prose = _FENCE.sub("", path.read_text("utf-8"))
        for target in _LINK.findall(prose):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            linked = path if not file_part else (path.parent / file_part)
            if not linked.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, f"broken relative links: {broken}"


# --------------------------------------------------------------------------- the simulator pages


def _workload_blocks() -> list[tuple[str, str]]:
    """(id, yaml text) for every yaml block with a top-level ``streams:`` key."""
    return [
        (f"{path.name}#{i}", text)
        for path in DOC_FILES
        for i, (lang, text) in enumerate(_blocks(path))
        if lang == "yaml" and re.search(r"^streams:", text, re.MULTILINE)
    ]


def test_there_are_workload_examples() -> None:
    assert len(_workload_blocks()) >= 5


@pytest.mark.parametrize(("where", "text"), [pytest.param(*b, id=b[0]) for b in _workload_blocks()])
def test_workload_examples_load(where: str, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from shuniu.core.traffic import load_workload

    # Trace paths in the docs are relative to the shipped examples.
    monkeypatch.chdir(ROOT / "examples" / "workloads")
    workload = load_workload(where, text=text, env={})
    first = next(workload.requests(seed=0, duration=60.0, prompts=False), None)
    assert first is not None, f"{where} yields no request in a minute"


def test_trace_lines_in_the_docs_decode() -> None:
    from shuniu.core.traffic import TraceLine

    lines = [
        line
        for path in DOC_FILES
        for lang, text in _blocks(path)
        if lang == "jsonl"
        for line in text.splitlines()
        if line.strip()
    ]
    assert lines
    arrivals = [msgspec.json.decode(line, type=TraceLine).arrival for line in lines]
    assert arrivals == sorted(arrivals)


def test_every_example_workload_is_described() -> None:
    text = (DOCS / "workloads.md").read_text("utf-8")
    examples = sorted((ROOT / "examples" / "workloads").glob("*.yaml"))
    missing = [p.name for p in examples if f"(../examples/workloads/{p.name})" not in text]
    assert not missing, f"example workloads not linked from docs/workloads.md: {missing}"


def _table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells (backticks removed) of every Markdown table row whose first cell matches
    ``first_cell``, a regular expression."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]
        if re.fullmatch(first_cell, cells[0]):
            rows.append(cells)
    return rows


def _plain_number(cell: str) -> str:
    return cell.replace(",", "")


@pytest.fixture
def _shipped_profiles_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from shuniu.backends.sim.profiles import ENV_PROFILE_PATH

    monkeypatch.delenv(ENV_PROFILE_PATH, raising=False)


@pytest.mark.usefixtures("_shipped_profiles_only")
def test_profile_tables_match_the_shipped_profiles() -> None:
    from shuniu.backends.sim.profiles import (
        kv_bytes_per_token,
        list_hardware,
        list_models,
        load_hardware,
        load_model,
    )

    text = (DOCS / "simulator.md").read_text("utf-8")
    hardware = _table_rows(text, "|".join(map(re.escape, list_hardware())))
    assert sorted(row[0] for row in hardware) == list_hardware()
    for name, _part, memory, bandwidth, bf16, fp8, _link, efficiency, overhead in hardware:
        hw = load_hardware(name)
        peak_fp8 = hw.peak_tflops.fp8
        assert float(memory) == hw.memory_gib, name
        assert float(_plain_number(bandwidth)) == hw.memory_bandwidth_gb_s, name
        assert float(bf16) == hw.peak_tflops.bf16, name
        assert fp8 == ("none" if peak_fp8 is None else f"{peak_fp8:g}"), name
        assert efficiency == f"{hw.compute_efficiency:g} / {hw.bandwidth_efficiency:g}", name
        assert float(overhead) == hw.iteration_overhead_ms, name
    models = _table_rows(text, "|".join(map(re.escape, list_models())))
    assert sorted(row[0] for row in models) == list_models()
    for name, _desc, _params, *architecture, kv, _weights in models:
        m = load_model(name)
        expected = [
            str(m.num_layers), str(m.hidden_size), f"{m.num_attention_heads} / {m.num_kv_heads}",
            str(m.head_dim), str(m.intermediate_size), str(m.vocab_size), str(m.max_position),
        ]  # fmt: skip
        assert [_plain_number(c) for c in architecture] == expected, name
        assert _plain_number(kv.split()[0]) == str(kv_bytes_per_token(m)), name


@pytest.mark.usefixtures("_shipped_profiles_only")
def test_sanity_numbers_are_what_the_snippet_prints() -> None:
    path = DOCS / "simulator.md"
    snippets = [t for lang, t in _blocks(path) if lang == "python" and "CostModel(" in t]
    assert len(snippets) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippets[0], str(path), "exec"), {})
    printed = []
    for line in out.getvalue().splitlines():
        tp, hardware, model, *numbers = line.split()
        printed.append([f"{tp.removesuffix('x')} {TIMES} {hardware}", model, *numbers])
    shown = _table_rows(path.read_text("utf-8"), rf"\d+ {TIMES} [\w.-]+")
    assert shown == printed, "the sanity-numbers table differs from what its snippet prints"
