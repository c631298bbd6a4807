"""The docs stay true to the code: hooks documented, reference generated, examples valid,
links alive."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from shuniu.core import config, hookspecs
from shuniu.core.config_loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import load_plugins

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOC_FILES = sorted(DOCS.glob("*.md"))
INVALID_MARK = "# this file is invalid on purpose"

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
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == config.__name__
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
