"""psd.torch against real psd shards: DistributedOptimizer equals
torch.optim on the same model and data, 2 workers equal 1 of twice the
batch, accumulation, top-k, bf16 autocast, the export loads into the
model, and embeddings from a sparse table."""
import contextlib
import copy
import os
import subprocess
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import psd  # noqa: E402
import psd.torch  # noqa: E402
from conftest import export, in_threads  # noqa: E402

STEPS = 50


class Net(torch.nn.Module):
    """A small CNN: a convolution, a linear layer, and a bias that forward
    never reaches when unused is set."""

    def __init__(self, unused=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 3)
        if unused:
            self.spare = torch.nn.Parameter(torch.ones(5))

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def data(n, seed=0):
    """n images and the labels a fixed random linear teacher gives them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    teacher = torch.randn(64, 3, generator=torch.Generator().manual_seed(99))
    return x, (x.flatten(1) @ teacher).argmax(1)


def model(seed=1, **kw):
    torch.manual_seed(seed)
    return Net(**kw)


def local_sgd(m, batches, lr=0.05, momentum=0.9, weight_decay=1e-4):
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return m


def psd_sgd(m, batches, client, **kw):
    args = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
    args.update(kw)
    opt = psd.torch.DistributedOptimizer(m, "momentum", client=client, **args)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return m, opt, losses


def assert_same(a, b, rtol=1e-4, atol=1e-5):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=rtol, atol=atol, msg=k)


def test_one_worker_equals_torch_sgd_momentum(cluster):
    servers = cluster.start(shards=2, args=["--consistency", "bsp"])
    x, y = data(16 * STEPS)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    ref = local_sgd(model(), batches)
    with psd.Client(servers) as c:
        # a bucket a parameter: four go out during each backward
        got, opt, losses = psd_sgd(model(), batches, c, bucket_bytes=1)
        assert opt.buckets == [[3], [2], [1], [0]]
        assert opt.steps == STEPS
    assert losses[-1] < losses[0]
    assert_same(got, ref)
    # and it trained: the weights moved from where they began
    assert not torch.allclose(got.fc.weight, model().fc.weight)


def test_rank0_weights_are_everyones_start(cluster):
    servers = cluster.start(args=["--consistency", "bsp", "--workers", "2"])
    with psd.Client(servers, rank=0, workers=2) as c0, \
            psd.Client(servers, rank=1, workers=2) as c1:
        m0, m1 = model(seed=1), model(seed=2)
        assert not torch.equal(m0.fc.weight, m1.fc.weight)
        done = {}
        t = threading.Thread(target=lambda: done.setdefault(
            1, psd.torch.DistributedOptimizer(m1, "sgd", client=c1)))
        t.start()  # rank 1 waits for rank 0's weights
        psd.torch.DistributedOptimizer(m0, "sgd", client=c0)
        t.join(60)
        assert 1 in done
        assert_same(m1, model(seed=1), rtol=0, atol=0)


def _two_workers(servers, shards_batches, **kw):
    models = [model(), model(seed=2)]  # here: torch's seed is the process's

    def run(r):
        with psd.Client(servers, rank=r, workers=2, timeout_ms=60000) as c:
            return psd_sgd(models[r], shards_batches[r], c, **kw)

    return in_threads(run, 2)


def test_two_workers_of_32_equal_one_of_64(cluster):
    servers = cluster.start(shards=2, args=["--consistency", "bsp", "--workers", "2"])
    x, y = data(64 * STEPS)
    big = [(x[i:i + 64], y[i:i + 64]) for i in range(0, len(x), 64)]
    halves = [[(bx[:32], by[:32]) for bx, by in big], [(bx[32:], by[32:]) for bx, by in big]]
    ref = local_sgd(model(), big)
    (m0, _, _), (m1, _, _) = _two_workers(servers, halves)
    assert_same(m0, ref)
    assert_same(m1, m0, rtol=0, atol=0)


@pytest.mark.parametrize("consistency", ["asp", "ssp:1"])
def test_two_workers_train_under(cluster, consistency):
    servers = cluster.start(args=["--consistency", consistency, "--workers", "2"])
    x, y = data(64 * 30, seed=3)
    halves = [[(x[i:i + 32], y[i:i + 32]) for i in range(r * 32, len(x), 64)] for r in range(2)]
    (_, o0, l0), (_, o1, l1) = _two_workers(servers, halves)
    assert o0.steps == o1.steps == 30
    assert np.mean(l0[-5:]) < np.mean(l0[:5])


def test_accumulation_of_two_halves_equals_the_whole_batch(cluster):
    servers = cluster.start(args=["--consistency", "bsp"])
    x, y = data(64 * 20, seed=4)
    big = [(x[i:i + 64], y[i:i + 64]) for i in range(0, len(x), 64)]
    ref = local_sgd(model(), big)
    m = model()
    with psd.Client(servers) as c:
        opt = psd.torch.DistributedOptimizer(m, "momentum", client=c, lr=0.05, momentum=0.9,
                                             weight_decay=1e-4, accum_steps=2)
        for bx, by in big:
            opt.zero_grad()
            for h in (slice(0, 32), slice(32, 64)):
                torch.nn.functional.cross_entropy(m(bx[h]), by[h]).backward()
            opt.step()
        # a step after one of the two passes is refused, and says why
        torch.nn.functional.cross_entropy(m(x[:4]), y[:4]).backward()
        with pytest.raises(RuntimeError, match="1 of accum_steps=2"):
            opt.step()
    assert_same(m, ref)


def test_an_unused_parameter_gets_a_zero_gradient(cluster):
    servers = cluster.start(args=["--consistency", "bsp"])
    x, y = data(16 * 5)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    with psd.Client(servers) as c:
        m, opt, _ = psd_sgd(model(unused=True), batches, c, weight_decay=0.0)
        assert opt.steps == 5
    torch.testing.assert_close(m.spare.detach(), torch.ones(5))


def test_topk_training_sends_a_fraction_and_learns(cluster):
    servers = cluster.start(shards=2)
    x, y = data(32 * 40, seed=5)
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, len(x), 32)]
    with psd.Client(servers) as c:
        m, opt, losses = psd_sgd(model(), batches, c, topk=0.1)
    assert opt._topk[0].k == int(np.ceil(0.1 * opt.params[0][1].numel()))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses


def test_bf16_autocast_trains_like_a_local_optimizer(cluster):
    servers = cluster.start()
    x, y = data(16 * 20, seed=6)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]

    def run(m, opt):
        losses = []
        for bx, by in batches:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(bx)
                assert out.dtype == torch.bfloat16
                loss = torch.nn.functional.cross_entropy(out.float(), by)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ref = model()
    run(ref, torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9))
    m = model()
    with psd.Client(servers, wire_dtype="bf16") as c:
        losses = run(m, psd.torch.DistributedOptimizer(m, "momentum", client=c, lr=0.05,
                                                       momentum=0.9))
    assert losses[-1] < losses[0]
    assert m.fc.weight.dtype == torch.float32
    # bf16 on the wire rounds each gradient to 8 bits of mantissa
    assert_same(m, ref, rtol=0.05, atol=0.02)


def test_the_export_loads_into_the_model(cluster, tmp_path):
    servers = cluster.start(shards=2)
    x, y = data(16 * 5)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    with psd.Client(servers) as c:
        m, _, _ = psd_sgd(model(), batches, c)
    tensors = export(servers, tmp_path / "model.safetensors")
    assert tensors["conv.weight"].shape == (4, 1, 3, 3)
    fresh = model(seed=9)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    assert_same(fresh, m, rtol=0, atol=0)


def test_embedding_bag_matches_torch_and_pushes_in_backward(cluster):
    servers = cluster.start(shards=2)
    with psd.Client(servers) as c:
        emb = psd.torch.EmbeddingBag(1000, 4, "emb", mode="mean", client=c, lr=0.5, seed=7)
        ids = torch.tensor([[3, 999, 3], [5, 6, 7]])
        out = emb(ids)
        rows = np.empty((5, 4), np.float32)
        c.pull_rows("emb", [3, 5, 6, 7, 999], rows).wait()
        w = torch.from_numpy(rows)
        ref = torch.nn.functional.embedding_bag(torch.tensor([[0, 4, 0], [1, 2, 3]]), w,
                                                mode="mean")
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        emb.finish()
        after = np.empty((5, 4), np.float32)
        c.pull_rows("emb", [3, 5, 6, 7, 999], after).wait()
        # d(sum of means)/d(row): 2/3 for id 3, 1/3 for the others; lr 0.5
        step = np.array([2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3], np.float32)[:, None] * 0.5
        np.testing.assert_allclose(after, rows - step, rtol=1e-5, atol=1e-6)
        with pytest.raises(IndexError, match=r"ids must be in \[0, 1000\)"):
            emb(torch.tensor([[1000]]))
        e = psd.torch.Embedding(10, 2, "e", client=c, init="zeros")
        with torch.no_grad():  # evaluation: a pull, no push
            assert torch.equal(e(torch.tensor([1, 2, 1])), torch.zeros(3, 2))
        assert e._pending is None


def example_run(cluster, tmp, name, gen_args, psd_args=()):
    """gen_clicks' data in tmp from gen_args, 2 shards (psd_args), and the
    example's path and environment to run it on them."""
    gen = os.environ.get("GEN_CLICKS_BIN")
    if not gen:
        pytest.skip("GEN_CLICKS_BIN is not set")
    r = subprocess.run([gen, "--out", str(tmp)] + gen_args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    servers = cluster.start(shards=2, args=psd_args)
    example = os.path.join(os.path.dirname(__file__), "..", "..", "worker", "python",
                           "examples", name)
    env = dict(os.environ)  # this Python's, sanitizer runtime included
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "..", "worker", "python")
    env["PSD_SERVERS"] = servers
    return example, env


def test_embedding_bag_collection_matches_its_bags_one_by_one(cluster):
    """The collection pulls every table before it waits: the same bags and
    the same pushes as calling each EmbeddingBag in turn."""
    servers = cluster.start(shards=2)
    inputs = [torch.tensor([[3, 9], [9, 4]]), torch.tensor([1, 2, 2, 5])]
    offsets = [None, torch.tensor([0, 1])]

    def bags(c, prefix):
        return [psd.torch.EmbeddingBag(100, 3, prefix + "a", mode="sum", client=c, lr=0.5),
                psd.torch.EmbeddingBag(100, 3, prefix + "b", mode="mean", client=c, lr=0.5,
                                       seed=4)]

    def rows(c, name):
        out = np.empty((6, 3), np.float32)
        c.pull_rows(name, [1, 2, 3, 4, 5, 9], out).wait()
        return out

    with psd.Client(servers) as c:
        one = bags(c, "one.")
        ref = [one[0](inputs[0]), one[1](inputs[1], offsets[1])]
        (ref[0].sum() + 2 * ref[1].sum()).backward()
        coll = psd.torch.EmbeddingBagCollection(bags(c, "all."))
        got = coll(inputs, offsets)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r)
        (got[0].sum() + 2 * got[1].sum()).backward()
        coll.finish()
        for t in ("a", "b"):
            one[0].finish()
            one[1].finish()
            np.testing.assert_array_equal(rows(c, "all." + t), rows(c, "one." + t))
        assert not np.array_equal(rows(c, "all.a"), np.zeros((6, 3), np.float32))
        with pytest.raises(ValueError, match="1 tensors for 2 tables"):
            coll(inputs[:1])
        with pytest.raises(ValueError, match="offsets: needed with a 1-D input"):
            coll(inputs)
        with pytest.raises(IndexError, match=r"ids must be in \[0, 100\)"):
            coll([inputs[0], torch.tensor([[100]])])
        with pytest.raises(ValueError, match="two bags of the same table"):
            psd.torch.EmbeddingBagCollection([one[0], one[0]])
        with pytest.raises(TypeError, match="psd.torch.EmbeddingBag"):
            psd.torch.EmbeddingBagCollection([torch.nn.EmbeddingBag(4, 2)])


def test_dlrm_example_learns_within_its_row_budget(cluster, tmp_path):
    """The DLRM example, 2 shards and 2 ranks, with admission, age eviction
    and a row budget of a fifth of each field's ids: it learns (better
    than the base rate by a margin), and no shard holds more rows of a
    field than its share of the budget."""
    data = tmp_path / "data"
    example, env = example_run(cluster, data, "dlrm.py", [
        "--criteo", "--train", "60000", "--test", "10000", "--features", "20000", "--seed", "5"],
        ["--workers", "2"])
    servers = env["PSD_SERVERS"]
    env["WORLD_SIZE"] = "2"
    ranks = [subprocess.Popen([os.environ.get("PYTHON", "/usr/bin/python3"), example, "--data",
                               str(data), "--batch", "512", "--evict-after", "40", "--threads",
                               "1", "--json", str(tmp_path / ("r%d.json" % r))],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(env, RANK=str(r))) for r in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in ranks]
    for p, out in zip(ranks, outs):
        assert p.returncode == 0, out
    import json
    got = json.load(open(tmp_path / "r0.json"))
    y = np.fromfile(data / "test.bin", np.dtype([("y", "<f4"), ("rest", "V260")]))["y"]
    q = float(y.mean())
    base = -(q * np.log(q) + (1 - q) * np.log(1 - q))  # the best constant guess's
    print("dlrm.py: held-out log-loss %.5f, base rate's %.5f, the true model's %.5f"
          % (got["test_logloss"], base, got["true_logloss"]))
    assert got["true_logloss"] < got["test_logloss"] < base - 0.01
    psctl = os.environ.get("PSCTL_BIN")
    if not psctl:
        pytest.skip("PSCTL_BIN is not set")
    r = subprocess.run([psctl, "--servers", servers, "--json", "status"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    tables = {}
    for shard in json.loads(r.stdout)["shards"]:
        for t in shard["tables"]:
            tables.setdefault(t["name"], []).append(t)
    for f in range(26):
        for t in tables["dlrm.C%d" % (f + 1)]:
            assert 0 < t["rows"] <= -(-got["rows"][f] // 2), (f, t)
    total = {k: sum(t[k] for ts in tables.values() for t in ts if "evicted_age" in t)
             for k in ("admitted", "held_back", "evicted_age", "evicted_budget")}
    print("dlrm.py: %s" % total)
    assert all(v > 0 for v in total.values()), total


def test_clicks_example_reaches_the_true_log_loss(cluster, tmp_path):
    example, env = example_run(cluster, tmp_path, "clicks.py", [
        "--train", "200000", "--test", "20000", "--features", "1000", "--active", "8",
        "--seed", "3"])
    r = subprocess.run([os.environ.get("PYTHON", "/usr/bin/python3"), example, "--data",
                        str(tmp_path), "--epochs", "2", "--json", str(tmp_path / "sum.json")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    got = json.load(open(tmp_path / "sum.json"))["test_logloss"]
    best = json.load(open(tmp_path / "truth.json"))["test_logloss"]
    print("clicks.py: held-out log-loss %.5f vs the true model's %.5f (%+.2f%%)"
          % (got, best, 100 * (got - best) / best))
    assert best * 0.9 < got < best * 1.02


def test_the_process_client_is_made_once_and_checked(cluster):
    servers = cluster.start()
    c = psd.torch.init(servers, wire_dtype="f16")
    try:
        assert psd.torch.init() is c
        with pytest.raises(ValueError, match="exists with wire_dtype='f16', not 'f32'"):
            psd.torch.DistributedOptimizer(model(), "sgd")
        with torch.no_grad():  # made under no_grad, its hooks still work
            opt = psd.torch.DistributedOptimizer(model(), "sgd", wire_dtype="f16")
        assert opt.client is c and len(opt._hooks) == 4
    finally:
        c.close()


def test_a_dataloader_with_worker_processes(cluster):
    """DataLoader workers are forked while the client is open: they never
    touch it, and training gives what it gives without them."""
    servers = cluster.start(args=["--consistency", "bsp"])
    x, y = data(16 * 10, seed=8)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    ref = local_sgd(model(), batches)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                         num_workers=2)
    with psd.Client(servers) as c:
        m, opt, _ = psd_sgd(model(), loader, c)
        assert opt.steps == 10
        got, _, _ = psd_sgd(model(), iter(loader), c, prefix="again.")  # and a second time
    assert_same(m, ref)
    assert_same(got, ref)


def scaled_loop(m, batches, scaler, opt, poison_at=None, autocast=None):
    """Steps through scaler (psd's or PyTorch's GradScaler) and opt, under
    autocast (a context manager maker) when given; the loss of step
    poison_at is made infinite (an overflow). Returns the scales after
    each step and the losses."""
    scales, losses = [], []
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        with (autocast() if autocast else contextlib.nullcontext()):
            loss = torch.nn.functional.cross_entropy(m(x).float(), y)
        if i == poison_at:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return scales, losses


def scaled_sgd(m, batches, client, poison_at=None, prefix="", **kw):
    """psd_sgd through a psd.torch.GradScaler; the loss of step poison_at
    is made infinite (an overflow)."""
    scaler = psd.torch.GradScaler(**kw)
    opt = psd.torch.DistributedOptimizer(m, "momentum", client=client, lr=0.05, momentum=0.9,
                                         weight_decay=1e-4, scaler=scaler, prefix=prefix)
    scales, _ = scaled_loop(m, batches, scaler, opt, poison_at)
    return m, opt, scales


def test_a_grad_scaler_without_overflow_changes_no_bit(cluster):
    """Scaling by 2^16 and unscaling are exact: the servers get the same
    gradients as without a scaler, and the scale grows on schedule."""
    servers = cluster.start(args=["--consistency", "bsp"])
    x, y = data(32 * 12, seed=5)
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, len(x), 32)]
    with psd.Client(servers) as c:
        plain, _, _ = psd_sgd(model(), batches, c, prefix="a.")
        scaled, opt, scales = scaled_sgd(model(), batches, c, growth_interval=5, prefix="b.")
    assert_same(scaled, plain, rtol=0, atol=0)
    assert opt.skipped == 0 and opt.steps == 12
    assert scales[4] == 2.0 ** 17 and scales[-1] == 2.0 ** 18


def test_an_overflow_skips_the_step_on_both_workers(cluster):
    """Worker 1's loss overflows at step 3: both workers skip that step
    (nothing pushed) and halve the scale, and the run ends where one
    without that step's batch ends, bit for bit."""
    servers = cluster.start(shards=2, args=["--consistency", "bsp", "--workers", "2"])
    x, y = data(64 * 8, seed=6)
    halves = [[(x[i:i + 32], y[i:i + 32]) for i in range(r * 32, len(x), 64)] for r in range(2)]
    models = [model(), model()]

    def run(r):
        with psd.Client(servers, rank=r, workers=2, timeout_ms=60000) as c:
            return scaled_sgd(models[r], halves[r], c, poison_at=3 if r == 1 else None)

    (m0, o0, s0), (m1, o1, s1) = in_threads(run, 2)
    assert o0.skipped == o1.skipped == 1 and o0.steps == o1.steps == 7
    assert s0 == s1 and s0[3] == 32768.0
    assert_same(m1, m0, rtol=0, atol=0)
    ref_servers = cluster.start(shards=2, args=["--consistency", "bsp", "--workers", "2"])
    without = [[b for i, b in enumerate(h) if i != 3] for h in halves]
    (ref, _, _), _ = _two_workers(ref_servers, without)
    assert_same(m0, ref, rtol=0, atol=0)


def test_a_grad_scaler_needs_its_optimizer(cluster):
    servers = cluster.start(args=["--consistency", "bsp"])
    with psd.Client(servers) as c:
        opt = psd.torch.DistributedOptimizer(model(), "sgd", client=c, lr=0.1)
        with pytest.raises(ValueError, match="made with scaler=this scaler"):
            psd.torch.GradScaler().step(opt)
        with pytest.raises(RuntimeError, match="no step"):
            psd.torch.GradScaler().update()
        with pytest.raises(ValueError, match="growth_interval"):
            psd.torch.GradScaler(growth_interval=0)
