"""The image's cache key (testbed.image): what the Containerfile copies, and a hash that moves with it."""

from __future__ import annotations

from pathlib import Path

from testbed import image as imagemod

BASES = ("localhost/b:1", "localhost/r:1")


def test_copied_sources_are_the_containerfiles_copy_sources() -> None:
    assert imagemod.copied_sources() == [
        "deploy/image-dependencies.txt", "deploy/image-build-dependencies.txt",
        "pyproject.toml", "README.md", "LICENSE", "egress_kvm", "rpc"]


def _tree(root: Path) -> Path:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "Containerfile").write_text("FROM x AS build\nCOPY a.txt \\\n  pkg ./\nCOPY --from=build /o /o\n")
    (root / "a.txt").write_text("a")
    (root / "other.txt").write_text("not copied")
    (root / "pkg" / "m.py").write_text("x = 1\n")
    (root / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    return root


def test_the_hash_moves_with_every_copied_file_and_nothing_else(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    assert imagemod.copied_sources(root / "Containerfile") == ["a.txt", "pkg"]
    first = imagemod.recipe_hash(bases=BASES, repo=root)
    assert imagemod.recipe_hash(bases=BASES, repo=root) == first
    (root / "other.txt").write_text("changed")
    (root / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"\1")
    (root / "pkg" / ".ruff_cache").mkdir()
    (root / "pkg" / ".ruff_cache" / "x").write_text("a linter's cache")
    assert imagemod.recipe_hash(bases=BASES, repo=root) == first  # not copied: the image is the same
    seen = {first}
    for change in (lambda: (root / "pkg" / "m.py").write_text("x = 2\n"),
                   lambda: (root / "pkg" / "new.py").write_text(""),
                   lambda: (root / "a.txt").write_text("b"),
                   lambda: (root / "Containerfile").write_text("FROM y AS build\nCOPY a.txt pkg ./\n")):
        change()
        seen.add(imagemod.recipe_hash(bases=BASES, repo=root))
    assert len(seen) == 5
    assert imagemod.recipe_hash(bases=("localhost/b:2", BASES[1]), repo=root) not in seen


def test_base_tags_name_their_recipe() -> None:
    assert imagemod.RUNTIME_BASE.tag != imagemod.BUILDER_BASE.tag
    changed = imagemod.BaseRecipe(name="runtime-base", mmdebstrap=imagemod.RUNTIME_BASE.mmdebstrap,
                                  config=(*imagemod.RUNTIME_BASE.config, "ENV X=1"))
    assert changed.tag.split(":")[0] == imagemod.RUNTIME_BASE.tag.split(":")[0]
    assert changed.tag != imagemod.RUNTIME_BASE.tag


def test_the_container_runs_as_the_deployment_says() -> None:
    run = imagemod.ContainerRun(image="localhost/egress-kvm:t", name="n",
                                mounts=((Path("/h/p.yaml"), "/etc/proxy-operator/providers.yaml"),))
    argv = run.argv(["run", "--x"])
    assert argv[:5] == ["podman", "--runtime", "runc", "--events-backend", "file"]
    for flag in ("--read-only", "--user=65532:65532", "--cap-drop=ALL", "--security-opt=no-new-privileges",
                 "--volume=/h/p.yaml:/etc/proxy-operator/providers.yaml:ro"):
        assert flag in argv
    assert argv[-3:] == ["localhost/egress-kvm:t", "run", "--x"]
    assert any(a.startswith("--ulimit=nofile=") for a in argv)
