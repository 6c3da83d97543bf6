"""A volume on an ancestor of the image's own files does not hide them; one at or below does."""

from __future__ import annotations

from pathlib import Path

from pathways_devcluster.node_agent.pod_volumes import (
    Mount,
    MountPoints,
    apply_mounts,
    host_path,
    mount_order,
    shown_through,
)

CHECKOUT = "/tmp/ci-clone"
VENV = "/tmp/ci-clone/.venv"
IMAGE = (CHECKOUT, VENV, "/usr")
PYTHON = f"{VENV}/bin/python"
TMP = Mount(Path("/state/volumes/uid/tmp"), "/tmp", read_only=False)


def test_only_the_outermost_image_paths_strictly_below_a_volume_show_through() -> None:
    assert shown_through("/tmp", IMAGE) == [CHECKOUT]
    assert shown_through("/tmp/", IMAGE) == [CHECKOUT]
    assert shown_through(CHECKOUT, IMAGE) == [VENV]
    assert shown_through(VENV, IMAGE) == []
    assert shown_through("/etc/config", IMAGE) == []


def test_rewriting_leaves_paths_inside_an_image_path_alone_under_an_ancestor_volume() -> None:
    assert host_path(PYTHON, [TMP], IMAGE) == PYTHON
    assert host_path(CHECKOUT, [TMP], IMAGE) == CHECKOUT
    assert host_path("/tmp/scratch/x", [TMP], IMAGE) == "/state/volumes/uid/tmp/scratch/x"
    assert host_path("/tmp/ci-clone-other", [TMP], IMAGE) == "/state/volumes/uid/tmp/ci-clone-other"
    assert host_path(PYTHON, [TMP]) == "/state/volumes/uid/tmp/ci-clone/.venv/bin/python"


def test_rewriting_still_points_a_volume_at_or_below_an_image_path_at_its_directory() -> None:
    data = Mount(Path("/state/volumes/uid/data"), f"{CHECKOUT}/data", read_only=False)
    venv = Mount(Path("/state/volumes/uid/venv"), VENV, read_only=False)
    assert host_path(f"{CHECKOUT}/data/x", [TMP, data], IMAGE) == "/state/volumes/uid/data/x"
    assert host_path(PYTHON, [venv], IMAGE) == "/state/volumes/uid/venv/bin/python"
    argv, env = apply_mounts(
        [PYTHON, "/tmp/out"], {"DATA": f"{CHECKOUT}/data"}, [TMP, data], "rewrite",
        MountPoints(), IMAGE,
    )  # fmt: skip
    assert argv == [PYTHON, "/state/volumes/uid/tmp/out"]
    assert env["DATA"] == "/state/volumes/uid/data"


def test_an_image_path_is_bound_into_an_ancestor_volume_which_is_then_bound_recursively() -> None:
    token = Mount(Path("/state/volumes/uid/token"), "/var/run/secrets", read_only=True)
    ro_tmp = Mount(TMP.source, "/tmp", read_only=True)
    assert mount_order([token, ro_tmp], IMAGE) == [
        Mount(Path(CHECKOUT), "/state/volumes/uid/tmp/ci-clone", read_only=False, recursive=True),
        Mount(TMP.source, "/tmp", read_only=True, recursive=True),
        token,
    ]
    flags = [m.bind_flags for m in mount_order([token, ro_tmp], IMAGE)]
    assert flags == ["rbind", "rbind,ro", "bind,ro"]


def test_a_volume_holding_other_volumes_sources_is_still_bound_last_with_its_image_bind() -> None:
    volumes = Path("/tmp/agent/volumes/uid")
    tmp = Mount(volumes / "tmp", "/tmp", False)
    data = Mount(volumes / "data", "/data", False)
    assert mount_order([tmp, data], IMAGE) == [
        data,
        Mount(Path(CHECKOUT), str(volumes / "tmp" / "ci-clone"), False, recursive=True),
        Mount(tmp.source, "/tmp", False, recursive=True),
    ]


def test_a_volume_with_no_image_path_below_it_is_bound_plainly_in_a_namespace() -> None:
    image = ("/nonexistent-image",)
    argv, _ = apply_mounts(["python"], {}, [TMP], "namespace", MountPoints(), image)
    assert argv[-5:] == [str(TMP.source), "/tmp", "bind", "--", "python"]
