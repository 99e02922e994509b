"""psd.Client against real psd shards: every call, its values, and the
errors it raises before and after anything is sent."""
import os
import subprocess

import numpy as np
import pytest

import psd
from conftest import child_env, export, in_threads


def test_library_is_found_and_matches():
    lib, path = psd.library()
    assert os.path.exists(path) or path.startswith("lib")
    assert lib.psc_abi_version() == psd._lib.ABI_VERSION == 1


def test_dense_push_pull_over_two_shards(cluster):
    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        assert c.shards == 2
        c.create_table("w", 1001, optimizer="sgd", lr=0.5)
        g = np.arange(1001, dtype=np.float32)
        assert c.push("w", g).wait() is None
        w = np.empty(1001, np.float32)
        assert c.pull("w", w).wait() is w
        np.testing.assert_array_equal(w, -0.5 * g)  # zeros, one SGD step
        out = np.empty(1001, np.float32)
        c.push_pull("w", np.ones(1001, np.float32), out).wait()
        np.testing.assert_allclose(out, -0.5 * g - 0.5)
        # a range of it
        part = np.empty(10, np.float32)
        c.pull("w", part, offset=500).wait()
        np.testing.assert_allclose(part, out[500:510])


def test_momentum_matches_the_update_rule(cluster):
    servers = cluster.start()
    with psd.Client(servers) as c:
        c.create_table("m", 4, optimizer="momentum", lr=0.1, momentum=0.9)
        g = np.array([1, 2, 3, 4], np.float32)
        w, v = np.zeros(4, np.float32), np.zeros(4, np.float32)
        out = np.empty(4, np.float32)
        for _ in range(5):
            c.push_pull("m", g, out).wait()
            v = 0.9 * v + g
            w = w - 0.1 * v
        np.testing.assert_allclose(out, w, rtol=1e-6)


def test_sparse_rows(cluster):
    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        c.create_sparse_table("emb", 3, lr=1.0)
        keys = np.array([2, 7, 1 << 40], np.uint64)
        grads = np.arange(9, dtype=np.float32).reshape(3, 3)
        c.push_rows("emb", keys, grads).wait()
        rows = np.empty((3, 3), np.float32)
        c.pull_rows("emb", keys, rows).wait()
        np.testing.assert_array_equal(rows, -grads)
        one = np.empty((1, 3), np.float32)
        c.pull_rows("emb", [7], one).wait()
        np.testing.assert_array_equal(one[0], -grads[1])


def test_torch_tensors_without_a_copy(cluster):
    torch = pytest.importorskip("torch")
    servers = cluster.start()
    with psd.Client(servers) as c:
        c.create_table("t", 6, lr=1.0)
        c.push("t", torch.ones(2, 3)).wait()
        out = torch.empty(2, 3)
        assert c.pull("t", out).wait() is out
        assert torch.equal(out, -torch.ones(2, 3))
        with pytest.raises(ValueError, match="out: the tensor is not contiguous"):
            c.pull("t", torch.empty(3, 2).t())


def test_bad_buffers_are_refused_before_sending(cluster):
    servers = cluster.start()
    with psd.Client(servers) as c:
        c.create_table("w", 8)
        with pytest.raises(TypeError, match="grad: float32 values are needed"):
            c.push("w", np.zeros(8, np.float64))
        with pytest.raises(ValueError, match="out: the array is not C-contiguous"):
            c.pull("w", np.zeros(16, np.float32)[::2])
        with pytest.raises(ValueError, match="outside table 'w' of 8"):
            c.push("w", np.zeros(9, np.float32))
        with pytest.raises(TypeError, match="grad: a numpy array or a CPU torch tensor"):
            c.push("w", [1.0] * 8)
        with pytest.raises(KeyError, match="not created or opened"):
            c.push("nope", np.zeros(8, np.float32))
        c.create_sparse_table("e", 2)
        with pytest.raises(ValueError, match="keys: keys must be strictly increasing"):
            c.pull_rows("e", [3, 3], np.zeros((2, 2), np.float32))
        with pytest.raises(ValueError, match="grads: 2 keys of dim 2 need 4 floats"):
            c.push_rows("e", [1, 2], np.zeros(3, np.float32))
        with pytest.raises(TypeError, match="is sparse"):
            c.pull("e", np.zeros(2, np.float32))
        # nothing of the above was sent: the clock did not move, and the
        # table still holds its zeros
        assert c.clock("w") == c.start_clock
        w = np.ones(8, np.float32)
        c.pull("w", w).wait()
        np.testing.assert_array_equal(w, 0)


def test_a_spec_clash_carries_the_servers_sentence(cluster):
    servers = cluster.start()
    with psd.Client(servers) as c:
        c.create_table("w", 8, lr=0.5)
        c.create_table("w", 8, lr=0.5)  # the same spec opens it
        with pytest.raises(psd.TableExistsError) as e:
            c.create_table("w", 9, lr=0.5)
        assert e.value.name == "PS_EEXIST"
        assert "exists with another spec" in e.value.message


def test_servers_down_raise_within_the_timeout():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(psd.TimeoutError) as e:
        psd.Client("tcp://127.0.0.1:%d" % port, timeout_ms=300)
    assert e.value.code == -12


def test_a_pull_waits_for_its_round_and_keeps_its_buffer(cluster):
    servers = cluster.start(args=["--consistency", "bsp", "--workers", "2"])
    with psd.Client(servers, rank=0, workers=2) as a, psd.Client(servers, rank=1, workers=2) as b:
        for c in (a, b):
            c.create_table("w", 4, lr=1.0)
        a.push("w", np.ones(4, np.float32)).wait()
        out = np.zeros(4, np.float32)
        h = a.pull("w", out)  # clock 1: waits for worker 1's push
        with pytest.raises(psd.TimeoutError):
            h.wait(timeout_ms=200)
        b.push("w", np.ones(4, np.float32)).wait()
        assert h.wait() is out  # the same handle, waited for again
        np.testing.assert_array_equal(out, -1.0)  # the mean of the two gradients
        with pytest.raises(ValueError, match="waited for already"):
            h.wait()


def test_a_table_waits_for_its_pushers_alone(cluster):
    """A pipeline stage's table: pushed by workers 0 and 2 of 3, its bsp
    round closes with their pushes, worker 1 pulls it without being waited
    for, and a push by worker 1 is refused naming the table."""
    servers = cluster.start(args=["--consistency", "bsp", "--workers", "3"])
    cs = [psd.Client(servers, rank=r, workers=3) for r in range(3)]
    try:
        for c in cs:
            c.create_table("stage", 4, lr=1.0, pushers=[0, 2])
        cs[0].push("stage", np.ones(4, np.float32)).wait()
        cs[2].push("stage", 3 * np.ones(4, np.float32)).wait()
        out = np.zeros(4, np.float32)
        cs[1].pull("stage", out).wait(timeout_ms=5000)  # clock 0: at once
        cs[0].pull("stage", out).wait(timeout_ms=5000)  # clock 1: the round of 0 and 2
        np.testing.assert_array_equal(out, -2.0)  # the mean of their gradients
        with pytest.raises(psd.Error, match="worker 1 does not push 'stage'"):
            cs[1].push("stage", np.ones(4, np.float32)).wait()
        with pytest.raises(psd.Error, match="another spec|exists with another spec"):
            cs[0].create_table("stage", 4, lr=1.0, pushers=[0])
        with pytest.raises(ValueError, match="strictly increasing"):
            cs[0].create_table("other", 4, pushers=[2, 0])
    finally:
        for c in cs:
            c.close()


def test_environment_defaults(cluster, monkeypatch):
    servers = cluster.start()
    monkeypatch.setenv("PSD_SERVERS", servers)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with psd.Client() as c:
        assert (c.rank, c.workers, c.servers) == (1, 3, [servers])
    monkeypatch.delenv("PSD_SERVERS")
    with pytest.raises(ValueError, match="PSD_SERVERS is not set"):
        psd.Client()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="rank: RANK is 'x', not a whole number"):
        psd.Client(servers)
    # an Indexed Job's index comes first; a pattern names the shards
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")
    monkeypatch.setenv("PSD_WORKERS", "5")
    monkeypatch.delenv("WORLD_SIZE")
    host, port = servers.rsplit(":", 1)
    with psd.Client("%s:[%s]" % (host, port)) as c:
        assert (c.rank, c.workers, c.servers) == (2, 5, [servers])
    with pytest.raises(ValueError, match="must ascend"):
        psd.Client("tcp://h-[3-1]:1")
    with pytest.raises(ValueError, match="rank 3 is not in"):
        psd.Client(servers, rank=3, workers=3)


def test_a_forked_child_cannot_use_the_parents_client(cluster):
    servers = cluster.start()
    c = psd.Client(servers)
    c.create_table("w", 4)
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            c.pull("w", np.zeros(4, np.float32))
        except RuntimeError as e:
            code = 0 if "forked child" in str(e) else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    # and the parent's client still works
    w = np.ones(4, np.float32)
    c.pull("w", w).wait()
    np.testing.assert_array_equal(w, 0)
    c.close()


def test_safetensors_round_trip_and_psctl_export(cluster, tmp_path):
    t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2], np.int64)}
    psd.save_safetensors(tmp_path / "t.safetensors", t, metadata={"step": 3})
    back = psd.load_safetensors(tmp_path / "t.safetensors")
    assert set(back) == {"a", "b"}
    np.testing.assert_array_equal(back["a"], t["a"])
    np.testing.assert_array_equal(back["b"], t["b"])
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(ValueError, match="the header is not JSON"):
        psd.load_safetensors(tmp_path / "bad.safetensors")

    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        c.create_table("fc.weight", 10, lr=1.0)
        c.push("fc.weight", np.arange(10, dtype=np.float32)).wait()
    model = export(servers, tmp_path / "model.safetensors")
    np.testing.assert_array_equal(model["fc.weight"], -np.arange(10, dtype=np.float32))


def _dropped(servers):
    """psd's count of workers dropped from the live set, from psctl."""
    import json
    import subprocess
    from conftest import child_env
    r = subprocess.run([os.environ["PSCTL_BIN"], "--servers", servers, "--json", "status"],
                       capture_output=True, text=True, env=child_env())
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    shards = doc["shards"] if isinstance(doc, dict) and "shards" in doc else doc
    return sum(s["workers_dropped"] for s in shards)


@pytest.mark.parametrize("heartbeat_ms", [100, -1])
def test_heartbeats_while_python_computes(cluster, heartbeat_ms):
    """A worker that computes for longer than --worker-timeout without
    calling the library stays in the live set: the client's own thread
    says it is alive. With heartbeats off it is dropped (the control)."""
    import time
    if not os.environ.get("PSCTL_BIN"):
        pytest.skip("PSCTL_BIN is not set")
    servers = cluster.start(args=["--consistency", "bsp", "--workers", "1", "--worker-timeout",
                                  "0.5"])
    with psd.Client(servers, heartbeat_ms=heartbeat_ms) as c:
        c.create_table("w", 4)
        c.push("w", np.ones(4, np.float32)).wait()
        if heartbeat_ms >= 0:
            # "computing": no call into the library for three timeouts
            time.sleep(1.5)
            assert _dropped(servers) == 0
        else:
            # the control: psd notices the silence, polled under a deadline
            deadline = time.monotonic() + 10
            while _dropped(servers) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _dropped(servers) == 1


def test_set_weights_before_the_first_step(cluster):
    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        c.create_table("w", 1001, lr=1.0)
        init = np.linspace(-1, 1, 1001).astype(np.float32)
        c.set_weights("w", init).wait()
        w = np.empty(1001, np.float32)
        c.pull("w", w).wait()
        np.testing.assert_array_equal(w, init)  # as they were, bit for bit
        c.set_weights("w", np.zeros(3, np.float32), offset=10).wait()  # again, a range
        c.pull("w", w).wait()
        assert w[10:13].tolist() == [0, 0, 0] and w[13] == init[13]
        c.push("w", np.ones(1001, np.float32)).wait()
        with pytest.raises(psd.StateError) as e:
            c.set_weights("w", init).wait()
        assert "has taken 1 optimizer steps" in e.value.message
        with pytest.raises(TypeError, match="values: float32 values are needed"):
            c.set_weights("w", init.astype(np.float64))
        c.create_sparse_table("e", 2)
        with pytest.raises(TypeError, match="is sparse"):
            c.set_weights("e", np.zeros(2, np.float32))


def test_await_set_holds_pulls_until_rank_0_sets(cluster):
    servers = cluster.start(shards=2, args=["--consistency", "bsp", "--workers", "2"])
    with psd.Client(servers, rank=0, workers=2) as r0, psd.Client(servers, rank=1, workers=2) as r1:
        for c in (r0, r1):
            c.create_table("w", 64, lr=1.0, await_set=True)
        out = np.zeros(64, np.float32)
        h = r1.pull("w", out)  # rank 1's first pull waits for the values
        with pytest.raises(psd.TimeoutError):
            h.wait(timeout_ms=200)
        init = np.arange(64, dtype=np.float32)
        r0.set_weights("w", init).wait()
        h.wait()
        np.testing.assert_array_equal(out, init)
        # a spec with await_set is another spec
        with pytest.raises(psd.TableExistsError):
            r0.create_table("w", 64, lr=1.0)


def test_a_shutdown_after_an_unchanged_checkpoint_writes_none(cluster, tmp_path):
    """psctl checkpoint, then nothing changes: the shutdown writes no second
    file (a large table would take as long again) and says which stands;
    after a change it writes one."""
    psctl = os.environ.get("PSCTL_BIN")
    if not psctl:
        pytest.skip("PSCTL_BIN is not set")
    ckpt = str(tmp_path / "ckpt")
    servers = cluster.start(args=["--checkpoint-dir", ckpt, "--checkpoint-every", "0"])
    with psd.Client(servers) as c:
        c.create_table("w", 64, lr=1.0)
        c.set_weights("w", np.arange(64, dtype=np.float32)).wait()
    r = subprocess.run([psctl, "--servers", servers, "checkpoint"], capture_output=True,
                       text=True, env=child_env())
    assert r.returncode == 0, r.stderr
    assert cluster.stop() == [0]
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    assert len(files) == 1, files
    assert "S0604 no checkpoint at shutdown: nothing changed since" in cluster.logs()
    assert files[0] in cluster.logs()
    # a change after the checkpoint: the shutdown writes it
    servers = cluster.start(args=["--checkpoint-dir", ckpt, "--checkpoint-every", "0"])
    with psd.Client(servers) as c:
        c.create_table("w", 64, lr=1.0)
        c.push("w", np.ones(64, dtype=np.float32)).wait()
    assert cluster.stop() == [0, 0]
    assert len([f for f in os.listdir(ckpt) if f.endswith(".safetensors")]) == 2


def test_a_set_table_and_its_shape_survive_a_restart(cluster, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    servers = cluster.start(args=["--checkpoint-dir", ckpt])
    init = np.arange(16, dtype=np.float32)
    with psd.Client(servers) as c:
        c.create_table("w", (4, 4), lr=1.0, await_set=True)
        c.set_weights("w", init).wait()
    assert cluster.stop() == [0]  # a checkpoint at shutdown
    servers = cluster.start(args=["--checkpoint-dir", ckpt])
    with psd.Client(servers) as c:
        c.create_table("w", (4, 4), lr=1.0, await_set=True)  # the same spec, shape too: opened
        w = np.zeros(16, np.float32)
        c.pull("w", w).wait(timeout_ms=5000)  # restored values count as set
        np.testing.assert_array_equal(w, init)


def test_a_tables_shape_comes_back_in_the_export(cluster, tmp_path):
    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        c.create_table("conv1.weight", (4, 1, 3, 3), lr=1.0)
        c.create_table("conv1.bias", 4, lr=1.0)
        g = np.arange(36, dtype=np.float32)
        c.push("conv1.weight", g).wait()
        c.create_table("conv1.weight", (4, 1, 3, 3), lr=1.0)  # the same spec: opened
        with pytest.raises(psd.TableExistsError):
            c.create_table("conv1.weight", (4, 9), lr=1.0)  # another shape
        with pytest.raises(ValueError, match="size: a shape is 1 to 8 positive integers"):
            c.create_table("x", (4, 0))
        # the most dimensions a shape may have, and one more
        c.create_table("deep", (1, 1, 1, 1, 1, 1, 2, 2))
        with pytest.raises(ValueError, match="size: a shape is 1 to 8"):
            c.create_table("deeper", (1, 1, 1, 1, 1, 1, 1, 2, 2))
    model = export(servers, tmp_path / "model.safetensors")
    assert model["conv1.weight"].shape == (4, 1, 3, 3)
    assert model["conv1.bias"].shape == (4,)
    assert model["deep"].shape == (1, 1, 1, 1, 1, 1, 2, 2)
    np.testing.assert_array_equal(model["conv1.weight"].ravel(), -g)


def test_topk_keeps_what_it_does_not_send():
    t = psd.TopK(10, 0.3)
    assert t.k == 3
    g = np.array([0.1, -5, 0.2, 3, 0, 0, 4, -0.3, 0, 0], np.float32)
    keys, vals = t.select(g)
    np.testing.assert_array_equal(keys, [1, 3, 6])
    np.testing.assert_array_equal(vals, [-5, 3, 4])
    np.testing.assert_allclose(t.residual, [0.1, 0, 0.2, 0, 0, 0, 0, -0.3, 0, 0])
    keys, vals = t.select(np.zeros(10, np.float32))  # what stayed goes out next
    np.testing.assert_array_equal(keys, [0, 2, 7])
    np.testing.assert_allclose(vals, [0.1, 0.2, -0.3])
    m = psd.TopK(4, 0.25, momentum=0.5)  # DGC's momentum correction
    keys, _ = m.select(np.array([1, 0, 0, 0], np.float32))
    np.testing.assert_array_equal(keys, [0])  # sent: its velocity goes too
    keys, vals = m.select(np.array([0.2, 0.9, 0.1, 0], np.float32))
    np.testing.assert_array_equal(keys, [1])
    np.testing.assert_allclose(m.velocity, [0.2, 0, 0.1, 0])
    np.testing.assert_allclose(m.residual, [0.2, 0, 0.1, 0])
    keys, vals = m.select(np.zeros(4, np.float32))  # velocity 0.1, 0.05 added
    np.testing.assert_array_equal(keys, [0])
    np.testing.assert_allclose(vals, [0.3])
    np.testing.assert_allclose(m.residual, [0, 0, 0.15, 0])
    with pytest.raises(ValueError, match="grad: holds a NaN"):
        m.select(np.array([np.nan, 0, 0, 0], np.float32))
    np.testing.assert_allclose(m.residual, [0, 0, 0.15, 0])  # untouched
    with pytest.raises(ValueError, match="ratio: a fraction"):
        psd.TopK(4, 0.0)


def test_push_keys_and_a_corked_bucket(cluster):
    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        c.create_table("d", 100, lr=1.0)
        with c.corked():  # both go to each shard in one message
            h1 = c.push_keys("d", [3, 97], np.array([1, 2], np.float32))
            h2 = c.push_keys("d", [50], np.array([4], np.float32))
        h1.wait()
        h2.wait()
        w = np.empty(100, np.float32)
        c.pull("d", w).wait()
        assert (w[3], w[50], w[97]) == (-1, -4, -2)
        assert np.count_nonzero(w) == 3
        with pytest.raises(ValueError, match="keys: key 100 is outside table 'd' of 100"):
            c.push_keys("d", [100], np.array([1], np.float32))
        with pytest.raises(ValueError, match="values: 1 values for 2 keys"):
            c.push_keys("d", [1, 2], np.array([1], np.float32))


def test_a_mirror_brings_what_changed(cluster):
    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        c.create_table("d", 5000, lr=1.0, init="uniform", init_scale=0.5)
        m = c.mirror("d")
        assert m.values.shape == (5000,) and m.values.dtype == np.float32
        assert m.pull().wait() is m.values
        w = np.empty(5000, np.float32)
        rng = np.random.default_rng(3)
        for _ in range(5):
            keys = np.unique(rng.integers(0, 5000, 40)).astype(np.uint64)
            c.push_keys("d", keys, rng.standard_normal(keys.size).astype(np.float32)).wait()
            m.pull().wait()
            c.pull("d", w).wait()
            np.testing.assert_array_equal(m.values, w)
        assert m.counts() == (10, 2)  # each shard's part whole once, then the changes
        m.values[:] = 0  # written by the caller: reset, and the next pull is whole
        m.reset()
        m.pull().wait()
        np.testing.assert_array_equal(m.values, w)
        assert m.counts() == (10, 4)
        h = m.pull()
        with pytest.raises(psd.BusyError, match="still outstanding"):
            m.pull()
        h.wait()
        # a range, into the caller's array
        part = np.empty(100, np.float32)
        r = c.mirror("d", part, offset=2450)
        r.pull().wait()
        np.testing.assert_array_equal(part, w[2450:2550])
        r.close()
        with pytest.raises(ValueError, match="closed"):
            r.pull()
    with pytest.raises(ValueError, match="the client is closed"):
        m.pull()


def test_votes_agree_between_clients(cluster):
    """The library's vote, from Python: two workers in bsp learn, each
    round, whether either said yes; rounds go on past a yes."""
    servers = cluster.start(shards=2, args=["--consistency", "bsp", "--workers", "2"])
    said = [[False, True, False, False, True], [False, False, False, True, True]]

    def worker(r):
        with psd.Client(servers, rank=r, workers=2) as c:
            return [c.vote("found_inf", flag) for flag in said[r]]

    got = in_threads(worker, 2)
    want = [a or b for a, b in zip(*said)]
    assert got[0] == want and got[1] == want


def test_a_vote_without_bsp_is_the_workers_own(cluster):
    servers = cluster.start(args=["--consistency", "asp", "--workers", "2"])
    with psd.Client(servers, rank=0, workers=2) as c:
        assert c.vote("found_inf", True) is True
        assert c.vote("found_inf", False) is False


def test_votes_run_ahead_of_the_model_clock(cluster, tmp_path):
    """A vote round per attempt, a model round per step taken: a client
    starting later joins at the model's clock, not the votes', and the
    export holds the model alone."""
    # (a restarted worker 0 takes its id once the first is silent for 1 s)
    servers = cluster.start(args=["--consistency", "bsp", "--workers", "1",
                                  "--worker-timeout", "1"])
    with psd.Client(servers, rank=0, workers=1) as c:
        c.create_table("w", 4, optimizer="sgd", lr=0.1)
        for _ in range(2):
            c.push("w", np.ones(4, np.float32)).wait()
        for flag in (True, False, True, False, False):
            c.vote("found_inf", flag)
    with psd.Client(servers, rank=0, workers=1) as c:
        assert c.start_clock == 2
        assert c.vote("found_inf", True) is True  # round 5: it found where the votes are
    assert list(export(servers, tmp_path / "e.safetensors")) == ["w"]
