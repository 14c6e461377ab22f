"""Thread pools sized to the CPUs the process may use (cpus.py): the affinity mask, capped
by a cgroup CPU quota; the operator's own settings win."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from openai_compat.ground import cpus
from tests.utils import RemoteServer


def test_a_cgroup_v2_quota_caps_the_affinity(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpus.cgroup_quota(tmp_path) == 1.5
    mine = len(os.sched_getaffinity(0))
    want = (2, "cgroup quota 1.5") if mine > 2 else (mine, "affinity")  # rounded up
    assert cpus.available(tmp_path) == want
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert cpus.available(tmp_path) == (1, "cgroup quota 0.5")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpus.cgroup_quota(tmp_path) is None


def test_a_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.cgroup_quota(tmp_path) == 1.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cgroup_quota(tmp_path) is None
    assert cpus.cgroup_quota(tmp_path / "none") is None


def test_the_operators_variables_win() -> None:
    env = {"OMP_NUM_THREADS": "7"}
    count, _ = cpus.size_pools(env)
    assert env["OMP_NUM_THREADS"] == "7" and env["RAYON_NUM_THREADS"] == str(count)
    assert env["MKL_NUM_THREADS"] == str(count)
    # idle OpenMP threads spin briefly, then sleep
    assert env["GOMP_SPINCOUNT"] == cpus.SPIN_COUNT == "10000" and "OMP_WAIT_POLICY" not in env
    for theirs in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(theirs)
        cpus.size_pools(env)
        assert env.get("OMP_WAIT_POLICY") == theirs.get("OMP_WAIT_POLICY")
        assert env.get("GOMP_SPINCOUNT") == theirs.get("GOMP_SPINCOUNT")


@pytest.mark.slow
def test_a_server_on_one_cpu_sizes_every_pool_to_one() -> None:
    """Started with an affinity of one CPU (as `taskset -c 0`, or a pod's limit): /ready
    reports one CPU, and torch's pools and the tokenizers' have one thread each."""
    # whatever this test process has: gone
    unset = dict.fromkeys((*cpus.THREAD_VARIABLES, "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    with RemoteServer(env=unset, cpus={0}) as srv:
        report = httpx.get(srv.url + "/ready").json()["cpus"]
    assert report["available"] == 1 and report["source"] == "affinity"
    assert report["torch_threads"] == 1 and report["torch_interop_threads"] == 1
    assert report["tokenizer_threads"] == 1 and report["omp_num_threads"] == "1"
    assert report["omp_wait_policy"] is None and report["gomp_spincount"] == "10000"


def test_the_quota_is_the_smallest_on_the_processs_own_cgroup_path(tmp_path: Path) -> None:
    """A pod's quota sits on its own cgroup, not the hierarchy's root (which has none): read
    /proc/self/cgroup's path and take the smallest quota from there up."""
    proc = tmp_path / "proc-cgroup"
    root = tmp_path / "v2"
    (root / "kubepods" / "pod1" / "app").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "kubepods" / "cpu.max").write_text("400000 100000\n")
    (root / "kubepods" / "pod1" / "cpu.max").write_text("150000 100000\n")
    (root / "kubepods" / "pod1" / "app" / "cpu.max").write_text("max 100000\n")
    proc.write_text("0::/kubepods/pod1/app\n")
    assert cpus.cgroup_quota(root, proc) == 1.5
    proc.write_text("0::/kubepods\n")
    assert cpus.cgroup_quota(root, proc) == 4.0
    proc.write_text("0::/elsewhere\n")  # a namespaced view: its own cgroup is the mount's root
    assert cpus.cgroup_quota(root, proc) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "docker" / "abc").mkdir(parents=True)
    for folder, quota in ((v1 / "cpu", -1), (v1 / "cpu" / "docker" / "abc", 50000)):
        (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (folder / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cpus.cgroup_quota(v1, proc) == 0.5
    assert cpus.available(v1, proc) == (1, "cgroup quota 0.5")
