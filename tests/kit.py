"""The test kit every layer of the tests shares: what a test builds a client, a node or a server's
round from, and the closeness checks every comparison of two paths is built on.

- the checkout and its data: ``ROOT``, ``find_data_dir`` (the offline data folder), ``data_env``
  (the environment a simulation gets for it), ``without_picture`` (a run config without the
  split's picture);
- building: ``fake_context``, ``make_client`` (the one way a test builds a client),
  ``initial_weights``, ``fit_res`` (a successful reply);
- the server's view of its nodes: ``Proxy`` (the one client proxy: an id, a NumPyClient, or a
  node's Context served as the ClientApp serves it), ``FakeManager``; ``serve_in_process`` (a
  whole run, ServerApp and ClientApps, in this process);
- the one closeness check every comparison below is built on: ``assert_arrays_close`` (lists or
  dicts of arrays or tensors), with ``assert_metrics_close`` for the scalar fit metrics beside
  them;
- the cohort path against the per-client path: ``assert_round_close`` (one round's results),
  ``assert_cohort_client_equals`` (a client of a ``cohort_round``), ``assert_cohort_matches``
  (a cohort of small mlp clients built here), ``assert_cohort_equals_per_client`` (clients
  through ``train_cohort``), ``assert_same_reply`` (a client's reply as a node sends it), and
  ``in_float64`` for methods compared in float64;
- a run crashed and resumed in process against the uninterrupted run: ``crash_and_resume``,
  ``assert_same_rounds``.

The cohort's tolerance: 1e-5 relative in float32 (vmap's batched kernels sum the same products
in another order, ``tasks/functional/rounds.py``), and a cohort of one exactly; each test passes
its own ``rel``.

The other modules of the kit: ``tests/kit_training.py`` (hand computations and independent
references of local training), ``tests/kit_server.py`` (the server and the cohort node driven
one call at a time), ``tests/kit_runs.py`` (runs outside this process: simulations, deployments,
README's commands, the results page). ``tests/conftest.py`` holds the fixtures only.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.client import NumPyClient
from flwr.common import (
    Code,
    FitRes,
    GetPropertiesRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_proxy import ClientProxy

from fl_app.client_app import client_fn
from fl_app.node.cohort_client import train_cohort
from fl_app.node.drift_client import DriftClient
from fl_app.registry import get_method, validate_config
from runner.results.report import read_metrics
from tasks.catalogue import InputShape
from tasks.datasets import input_shape
from tasks.functional import (
    CohortResult,
    Hyper,
    LocalUpdate,
    Round,
    RoundResult,
    cohort_round,
    local_round,
    module_state,
)
from tasks.functional.rounds import stack_trees, unstack_tree
from tasks.models import build_model, get_weights

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


# ------------------------------------------------------------------ the checkout and its data
def find_data_dir() -> Path:
    """$FL_DATA_DIR when set, else the data folder beside the checkout (which may not exist:
    a fresh clone has none, and the tests that need data then skip, ``shared_data`` in
    conftest.py)."""
    configured = os.environ.get("FL_DATA_DIR")
    return Path(configured).expanduser().resolve() if configured else SHARED_DATA


def has_data(folder: Path) -> bool:
    """Whether ``folder`` holds the offline data (its MNIST training file)."""
    return (folder / "mnist" / "train.parquet").exists()


def data_env() -> dict[str, str]:
    """``{"FL_DATA_DIR": folder}`` for a simulation's environment when the offline data folder
    exists, else ``{}``: a missing folder is never handed on (a run would fail on it instead of
    falling back, and a test that needs data skips before it launches one)."""
    found = find_data_dir()
    return {"FL_DATA_DIR": str(found)} if has_data(found) else {}


# The tests' runs leave the split's picture out (``split-picture``: a matplotlib import and ~0.5 s
# per run, about 20 s of the default run); a test that looks at the picture sets it true.
# tests/data/test_partitioners.py's test_a_run_writes_the_split_picture_unless_told_not_to checks a
# run's picture; test_split_files_draw_and_count_every_client and test_check_draws_the_split_
# without_training check the drawing and run_simulation.py --check's pictures.
NO_PICTURE = {"split-picture": False}


def without_picture(run_config: dict) -> dict:
    """``run_config`` with ``split-picture`` false unless it sets the key itself."""
    return {**NO_PICTURE, **run_config}


# ------------------------------------------------------------------------------- building
def fake_context(run_config: dict | None = None) -> Context:
    """A node's Context with run id and node id 0, no node config, an empty ``state`` and the
    run config ``run_config`` (empty when not given); a test sets ``node_config`` itself."""
    return Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config or {})


def make_client(update: LocalUpdate | str, overrides: dict, x: torch.Tensor, y: torch.Tensor,
                context: Context | None = None, client_cls: type[DriftClient] = DriftClient, partition: int = 0,
                num_partitions: int = 1) -> DriftClient:
    """The one way a test builds a client: the one generic client running ``update`` (a
    ``LocalUpdate``, or a method's name: its registered update, and ``strategy`` set to it) on
    in-memory data (no dataset is loaded; ``DriftClient.use_data``), partition ``partition`` of
    ``num_partitions``, its run config ``overrides`` on synthetic/logreg (validated, so a
    misspelt key fails). ``context``: a ``fake_context()`` when not given. ``client_cls``: a
    test's recording subclass of ``DriftClient``."""
    if isinstance(update, str):
        overrides = {"strategy": update, **overrides}
        update = get_method(update).update
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", **overrides})
    client = client_cls(update, cfg, context or fake_context(), partition_id=partition, num_partitions=num_partitions)
    client.use_data((x, y))
    return client


def initial_weights(client: DriftClient, seed: int = 0) -> list[np.ndarray]:
    """A seeded initial model of the client's architecture (its run config's model on its
    dataset's input shape), as the arrays the server would send: the same arrays for the same
    seed."""
    return get_weights(build_model(client.cfg["model"], input_shape(client.cfg["dataset"]), seed=seed))



def fit_res(arrays: list[np.ndarray], num_examples: int, metrics: dict | None = None, **more) -> FitRes:
    """A successful client reply: its metrics given as a dict or as keyword arguments (not both)."""
    assert metrics is None or not more, "metrics as a dict or as keywords, not both"
    return FitRes(
        status=Status(code=Code.OK, message=""),
        parameters=ndarrays_to_parameters([np.asarray(a) for a in arrays]),
        num_examples=num_examples,
        metrics=more if metrics is None else metrics,
    )


# ------------------------------------------------------------------ the server's view of its nodes
CLIENTS = 10  # the partitions a Proxy with a partition reports


class Proxy(ClientProxy):
    """The tests' one client proxy: a node as the server sees it, in this process, without
    Flower's transport.

    - ``Proxy(cid)``: a node with an id only (a reply's sender, a sampled client);
    - ``Proxy(cid, client)``: ``fit`` hands the FitIns to ``client``, a NumPyClient (a method's
      ``DriftClient``, or one inside ``NodeClient``), as Flower's transport would;
    - ``Proxy(cid, context)``: a node served as the ClientApp serves it: every message builds
      the client anew with ``fl_app.client_app.client_fn`` on the node's own Context (node
      config, run config, ``context.state``); left out: Flower's transport and the ClientApp's
      mods;
    - ``partition=p``: ``get_properties`` answers that the node holds partition ``p`` of
      ``CLIENTS`` (read back as ``proxy.partition``).

    A message the proxy has no answer for raises ``NotImplementedError``."""

    def __init__(self, cid: str, node: NumPyClient | Context | None = None, partition: int | None = None):
        super().__init__(cid)
        self.context = node if isinstance(node, Context) else None
        self.client = None if isinstance(node, Context) else node
        self.partition = partition

    def fit(self, ins, timeout, group_id):
        if self.context is not None:
            return client_fn(self.context).fit(ins)
        if self.client is None:
            raise NotImplementedError(f"proxy {self.cid} has no client to fit")
        arrays, n, metrics = self.client.fit(parameters_to_ndarrays(ins.parameters), ins.config)
        return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)

    def get_properties(self, ins, timeout, group_id):
        if self.context is not None:
            return client_fn(self.context).get_properties(ins)
        if self.partition is None:
            raise NotImplementedError(f"proxy {self.cid} has no properties")
        return GetPropertiesRes(Status(Code.OK, ""), {"partition-id": self.partition, "num-partitions": CLIENTS})

    def evaluate(self, ins, timeout, group_id):
        if self.context is None:
            raise NotImplementedError(f"proxy {self.cid} does not evaluate")
        return client_fn(self.context).evaluate(ins)

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


class FakeManager:
    """Just enough of a ClientManager for a strategy's ``configure_fit``: ``n`` proxies with ids
    "0" to "n-1" (``Proxy(cid)``), the first ``num_clients`` of them sampled."""

    def __init__(self, n):
        self.proxies = [Proxy(str(i)) for i in range(n)]

    def num_available(self):
        return len(self.proxies)

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return self.proxies[:num_clients]


def serve_in_process(run_config: dict, nodes: int) -> None:
    """One run with no Ray and no SuperLink: the ServerApp's ``server_fn`` components (its
    ``DriftServer``, run as Flower's ServerApp runs it: ``fit``), ``nodes`` new nodes (partition k
    of ``nodes``, empty ``context.state``) served as the ClientApp serves them (``Proxy`` on each
    node's Context). Exceptions of the server (an injected crash, ``RunAborted``) propagate.
    Clients fit one at a time: in one process they share the cached model
    (``tasks.models.cached_model``), as the clients of one Ray actor do. The split's picture is
    left out unless ``run_config`` asks for it (``without_picture``)."""
    from fl_app.server_app import server_fn

    run_config = without_picture(run_config)
    components = server_fn(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    server = components.server
    manager = server.client_manager()
    for k in range(nodes):  # node ids in another order than the partitions
        node_config = {"partition-id": k, "num-partitions": nodes}
        context = Context(run_id=0, node_id=900 - 7 * k, node_config=node_config, state=RecordDict(),
                          run_config=run_config)
        manager.register(Proxy(str(900 - 7 * k), context))
    server.set_max_workers(1)
    server.fit(components.config.num_rounds, timeout=None)


# ------------------------------------------------------------------------------ closeness
def assert_arrays_close(got, want, rel: float, what: str) -> None:
    """``got`` equals ``want`` array by array: two lists of the same length, or two dicts with
    the same keys, of numpy arrays or torch tensors. Each array of ``got`` has the shape and dtype
    of its counterpart in ``want``, only finite entries, and

    - when ``rel`` is 0, or the arrays hold integers or booleans: exactly its counterpart's values;
    - else: no entry further from its counterpart than ``rel`` times the largest magnitude in the
      wanted array (taken as 1e-12 when smaller): one tolerance per array, as a summation
      order's rounding is relative to the array's scale, not to each entry's.

    A failure names ``what``, the first array that differs (its index or key) and, for values,
    the relative difference found."""
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{what}: got a {type(got).__name__}, want a dict"
        assert set(got) == set(want), (f"{what}: keys differ: only got {sorted(set(got) - set(want))}, "
                                       f"only wanted {sorted(set(want) - set(got))}")
        pairs = [(f"{what}: {name}", got[name], want[name]) for name in want]
    else:
        assert len(got) == len(want), f"{what}: {len(got)} arrays, want {len(want)}"
        pairs = [(f"{what}[{i}]", u, v) for i, (u, v) in enumerate(zip(got, want))]
    for name, u, v in pairs:
        _assert_array_close(_as_tensor(u), _as_tensor(v), rel, name)


def _as_tensor(array) -> torch.Tensor:
    """A torch tensor of ``array``'s values and dtype (a numpy array is copied: it may be
    read-only, as the arrays decoded from Flower's bytes are)."""
    if isinstance(array, torch.Tensor):
        return array.detach()
    return torch.from_numpy(np.array(array))


def _assert_array_close(u: torch.Tensor, v: torch.Tensor, rel: float, name: str) -> None:
    """One array of ``assert_arrays_close``."""
    assert u.shape == v.shape, f"{name}: shape {tuple(u.shape)}, want {tuple(v.shape)}"
    assert u.dtype == v.dtype, f"{name}: dtype {u.dtype}, want {v.dtype}"
    assert torch.isfinite(u).all(), f"{name}: not finite ({int((~torch.isfinite(u)).sum())} entries)"
    if u.numel() == 0:
        return
    if rel == 0 or not u.is_floating_point():
        assert torch.equal(u, v), f"{name}: not equal (relative difference {_relative_difference(u, v):.3g})"
        return
    allowed = rel * v.abs().max().clamp_min(1e-12)
    assert (u - v).abs().max() <= allowed, f"{name}: relative difference {_relative_difference(u, v):.3g} > {rel:g}"


def _relative_difference(u: torch.Tensor, v: torch.Tensor) -> float:
    """The largest |u - v| over the largest |v| (1e-12 at least), in float64: for messages."""
    u, v = u.double(), v.double()
    return float((u - v).abs().max() / v.abs().max().clamp_min(1e-12))


def assert_metrics_close(got: dict, want: dict, rel: float, what: str) -> None:
    """Every metric of ``want`` (scalars; ``got`` may have more) is in ``got`` with the same
    value: exactly when ``rel`` is 0 or the wanted value is an int (step and example counts),
    else within ``rel`` of it relative (``pytest.approx``, with its 1e-12 absolute floor). A
    failure names ``what`` and the metric."""
    for key, value in want.items():
        assert key in got, f"{what}: no {key!r}"
        expected = value if rel == 0 or isinstance(value, int) else pytest.approx(value, rel=rel)
        assert got[key] == expected, f"{what}: {key}: {got[key]!r}, want {value!r} (rel {rel:g})"


# ------------------------------------------------------- the cohort against the per-client path
def round_arrays(result: RoundResult, skip_buffers: tuple[str, ...] = ()) -> dict:
    """Every array of a round's result under one name: its weights and buffers (but
    ``skip_buffers``) by their names, its new state and reply entries as ``state <entry>.<name>``
    and ``reply <entry>.<name>``."""
    arrays = {**result.params, **{n: b for n, b in result.buffers.items() if n not in skip_buffers}}
    arrays.update({f"state {s}.{n}": t for s, tree in result.state.items() for n, t in tree.items()})
    arrays.update({f"reply {r}.{n}": t for r, tree in result.reply.items() for n, t in tree.items()})
    return arrays


def assert_round_close(got: RoundResult, want: RoundResult, rel: float, metrics_rel: float, what: str,
                       skip_buffers: tuple[str, ...] = ()) -> None:
    """``got``'s round against ``want``'s: the same number of steps; the same weights, buffers
    (but ``skip_buffers``), new state and reply entries, each within ``rel`` as
    ``assert_arrays_close`` holds them (exactly when ``rel`` is 0); every fit metric of ``want``
    within ``metrics_rel`` as ``assert_metrics_close`` holds them."""
    steps, want_steps = got.metrics["num_steps"], want.metrics["num_steps"]
    assert steps == want_steps, f"{what}: {steps} steps, want {want_steps}"
    assert_arrays_close(round_arrays(got, skip_buffers), round_arrays(want, skip_buffers), rel, what)
    assert_metrics_close(got.metrics, want.metrics, metrics_rel, f"{what}'s metrics")


def assert_cohort_client_equals(together: CohortResult, k: int, alone: RoundResult, rel: float,
                                skip_buffers: tuple[str, ...] = ()) -> None:
    """Client ``k`` of ``together`` (a ``cohort_round``'s result) against ``alone`` (its own
    ``local_round``): ``assert_round_close`` with ``rel`` for the arrays (exactly when ``rel`` is
    0) and the fit metrics within ``rel`` (1e-12 at least)."""
    assert_round_close(together.client(k), alone, rel, max(rel, 1e-12), f"cohort client {k}", skip_buffers)


FLAT = InputShape(0, 12, 5)  # 12 features, 5 classes: an mlp cohort runs in about a second


def assert_cohort_matches(update: LocalUpdate, keys: dict, states=None, server=None,
                          sizes=(14, 6, 12), model_name: str = "mlp", clip_norm: float = 0.0) -> None:
    """A cohort of len(sizes) clients of different sizes (one vmap per step, batch 4, 2 epochs,
    SGD with momentum 0.9 and weight decay 5e-4) against each client's own ``local_round``:
    within 1e-5 relative (float32), and a cohort of one exactly (``assert_cohort_client_equals``),
    with the fit metrics in the same order. ``states(shapes, k)`` / ``server(shapes)`` build
    client k's state and the server's message from the parameter shapes ({name: shape})."""
    gen = torch.Generator().manual_seed(5)
    models = [build_model(model_name, FLAT, seed=k) for k in range(len(sizes))]
    params, buffers = (stack_trees(t) for t in zip(*(module_state(m) for m in models)))
    params = {n: p.contiguous() for n, p in params.items()}
    shapes = {n: p.shape[1:] for n, p in params.items()}
    data = [(torch.randn(n, 12, generator=gen), torch.randint(0, FLAT.classes, (n,), generator=gen)) for n in sizes]
    client_states = [states(shapes, k) if states else {} for k in range(len(sizes))]
    sent = {"buffers": {}, **(server(shapes) if server else {})}
    skeleton = build_model(model_name, FLAT).to("meta")
    hp = Hyper(lr=0.05, momentum=0.9, weight_decay=5e-4, keys=keys, clip_norm=clip_norm)
    for members, rel in ((list(range(len(sizes))), 1e-5), ([0], 0)):
        sub = {n: p[members] for n, p in params.items()}
        subb = {n: b[members] for n, b in buffers.items()}
        together = cohort_round(update, skeleton, sub, subb, [client_states[k] for k in members], sent, hp,
                                [data[k] for k in members], 4, 2,
                                [torch.Generator().manual_seed(10 + k) for k in members])
        for j, k in enumerate(members):
            alone = local_round(Round(update, skeleton, unstack_tree(sub, j), unstack_tree(subb, j), client_states[k],
                                sent, hp, *data[k], 4, 2, torch.Generator().manual_seed(10 + k)))
            assert_cohort_client_equals(together, j, alone, rel)
            assert list(together.metrics[j]) == list(alone.metrics)


def assert_cohort_equals_per_client(clients: list[DriftClient], weights: list, rel: float = 1e-5,
                                    float64: bool = False) -> None:
    """Every client's round of ``weights`` (server round 3) through the cohort path (all in one
    ``train_cohort``) against its own ``local_round``: ``assert_round_close`` with ``rel`` for
    weights, buffers, the client's new state and its reply beyond the weights, and the fit
    metrics within ``rel`` (1e-6 at least: both drivers sum the steps' losses in float32); both
    paths in float64 when ``float64`` (``in_float64``). Each path prepares its own rounds (a
    round's batch-order generator is consumed by training)."""
    config = {"server-round": 3}
    convert = in_float64 if float64 else list
    together = train_cohort(convert([c.prepare_round(weights, config) for c in clients]))
    for k, (client, cohort) in enumerate(zip(clients, together)):
        alone = local_round(convert([client.prepare_round(weights, config)])[0])
        assert_round_close(cohort, alone, rel, max(rel, 1e-6), f"client {k} (partition {client.partition_id})")


def in_float64(jobs: list[Round]) -> list[Round]:
    """The prepared rounds ``jobs`` with their model (one float64 copy, shared: a cohort's clients
    run one skeleton), weights, floating buffers, data and received buffers in float64, for a
    method whose float32 rounding differences between the paths grow too fast to compare. The
    rounds handed in are left as they are."""
    model = copy.deepcopy(jobs[0].model).double()

    def wide(tree):
        return {n: t.double() if t.is_floating_point() else t.clone() for n, t in tree.items()}

    out = []
    for job in jobs:
        buffers = wide(job.buffers)
        out.append(replace(job, model=model, params=wide(job.params), buffers=buffers, x=job.x.double(),
                           server={**job.server, "buffers": buffers}))
    return out


def untimed(metrics: dict) -> dict:
    """``metrics`` less its timings (``*_seconds``), which no two runs share."""
    return {k: v for k, v in metrics.items() if not k.endswith("_seconds")}


def assert_same_reply(got, want: tuple, rel: float, what: str = "reply") -> None:
    """A client's reply against the per-client one, ``want`` = (arrays, num_examples, metrics) as
    a NumPyClient's ``fit`` returns them. ``got``: the same triple, or a ``FitRes`` (a cohort
    node's reply split from its bundle; an error string in its place fails, showing it). The
    same number of examples; the arrays as ``assert_arrays_close`` holds them (same count,
    shapes and dtypes; within ``rel``, exactly when 0); the same metric names but timings, each
    as ``assert_metrics_close`` holds them (ints exactly, floats within ``rel``)."""
    assert not isinstance(got, str), f"{what}: {got}"
    if isinstance(got, FitRes):
        got = (parameters_to_ndarrays(got.parameters), got.num_examples, got.metrics)
    arrays, num_examples, metrics = got
    want_arrays, want_examples, want_metrics = want
    assert num_examples == want_examples, f"{what}: {num_examples} examples, want {want_examples}"
    assert_arrays_close(arrays, want_arrays, rel, f"{what}'s arrays")
    metrics, want_metrics = untimed(metrics), untimed(want_metrics)
    assert set(metrics) == set(want_metrics), f"{what}: metrics {sorted(metrics)}, want {sorted(want_metrics)}"
    assert_metrics_close(metrics, want_metrics, rel, f"{what}'s metrics")


# ----------------------------------------------------- a crashed and resumed run, in process
def crash_and_resume(cfg: dict, tmp_path, rounds: int = 4, crash_after: int = 2) -> tuple[list, list]:
    """The metric rows of an uninterrupted in-process run of ``cfg`` (synthetic data, logreg, 4
    nodes, half sampled per round; ``serve_in_process``) and of the same run crashed after round
    ``crash_after`` (checked: it raised and recorded that many rounds) and resumed by a new
    server and new nodes (nothing kept in memory), each ``rounds`` rounds."""
    base = {"dataset": "synthetic", "model": "logreg", "num-server-rounds": rounds, "fraction-fit": 0.5,
            "learning-rate": 0.05, "tracking": "none", "results-dir": str(tmp_path), **cfg}
    serve_in_process({**base, "run-name": "full"}, 4)
    with pytest.raises(RuntimeError, match=f"injected crash after round {crash_after}"):
        serve_in_process({**base, "run-name": "cut", "inject-faults": f"crash-after:{crash_after}"}, 4)
    assert len(read_metrics(tmp_path / "cut")) == crash_after
    serve_in_process({**base, "run-name": "cut", "resume": True}, 4)
    return read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")


def assert_same_rounds(full: list[dict], resumed: list[dict], columns: tuple[str, ...], start: int) -> None:
    """The two runs have the same rounds, and from row ``start`` on each round agrees on the
    test and training losses and on ``columns`` (the method's own server metrics), each within
    1e-6 relative of the resumed run's value (``assert_metrics_close``)."""
    assert [r["round"] for r in full] == [r["round"] for r in resumed]
    names = ("test_loss", "train_loss", *columns)
    for a, b in zip(full[start:], resumed[start:]):
        assert_metrics_close({n: float(a[n]) for n in names}, {n: float(b[n]) for n in names}, 1e-6,
                             f"round {a['round']}")
