"""The documentation: the site builds in strict mode (a broken link or anchor fails it, as this shows), its quickstart
page is the README's (one copy, which tests/e2e/test_quickstart.py runs), and the README stays a short page whose links
all lead somewhere."""
import html
import re
import shutil
import subprocess
from pathlib import Path

from conftest import REPO

MKDOCS = REPO / ".venv-docs" / "bin" / "mkdocs"
README_MAX_LINES = 200


def _build(root: Path, out: Path) -> subprocess.CompletedProcess:
    assert MKDOCS.is_file(), f"{MKDOCS} is missing: `make docs` (or `make test-setup`) builds its environment"
    return subprocess.run([str(MKDOCS), "build", "--strict", "-d", str(out)], capture_output=True, text=True,
                          cwd=root, timeout=300)


def test_the_site_builds_in_strict_mode_with_the_readmes_quickstart(tmp_path):
    built = _build(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    page = (tmp_path / "site" / "getting-started" / "quickstart" / "index.html").read_text()
    assert "coati grpo --config grpo.yaml --nproc_per_node 2" in html.unescape(re.sub(r"<[^>]+>", "", page))
    assert (tmp_path / "site" / "guides" / "grpo" / "index.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copytree(REPO / "examples" / "library", tmp_path / "examples" / "library")   # a page's snippet
    page = tmp_path / "docs" / "guides" / "ppo.md"
    for link in ("[gone](no_such_page.md)", "[gone](grpo.md#no-such-heading)"):
        page.write_text(page.read_text().split("\n[gone]")[0] + f"\n{link}\n")
        built = _build(tmp_path, tmp_path / "site")
        assert built.returncode != 0 and link[7:-1].split("#")[-1] in built.stdout + built.stderr, link


def test_the_readme_is_short_and_every_link_in_it_leads_somewhere():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < README_MAX_LINES
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not link.startswith("http")]
    assert local and all((REPO / link).is_file() for link in local), [l for l in local if not (REPO / l).is_file()]


def test_the_reference_pages_are_the_codes():
    """docs/reference is what `python -m coati.cli.reference` generates now: a flag, default, range or registered
    part changed in the code and not in the docs fails here (regenerate them)."""
    from coati.cli.reference import pages

    folder, generated = REPO / "docs" / "reference", pages()
    assert sorted(p.name for p in folder.glob("*.md")) == sorted(generated)
    stale = [name for name, text in generated.items() if (folder / name).read_text() != text]
    assert not stale, f"stale: {stale}; run `python -m coati.cli.reference docs/reference`"
    grpo = (folder / "grpo.md").read_text()
    assert "| `--learning_rate` " in grpo or "(`--learning_rate`)" in grpo   # TRL's names are listed with coati's


def test_the_metric_catalogue_describes_the_published_names_and_no_made_up_one():
    from coati.trainer.metric_names import PUBLISHED_GRPO, describe

    assert all(describe(name) for name in PUBLISHED_GRPO), [name for name in PUBLISHED_GRPO if not describe(name)]
    assert describe("train/rewards/math_answer/p95").pattern == "train/rewards/<component>/<stat>"
    assert describe("train/reward_p50").pattern == "train/reward_p<q>"
    assert describe("train/made_up") is None and describe("train/loss") and describe("val/loss") is None
