"""The process mesh: named axes, and the rank formulas that live only there."""
import itertools

import pytest

from hf_reference import tiny_model_kwargs
from mindrlhf.configs import ModelConfig
from mindrlhf.configs.errors import ConfigError
from mindrlhf.models.specs import mesh_layouts
from mindrlhf.parallel.mesh import Mesh

LAYOUTS = [(1, 1, 1), (1, 4, 1), (1, 1, 4), (2, 2, 1), (1, 2, 2), (2, 1, 2), (2, 2, 2), (4, 1, 1)]   # (pp, dp, tp)


@pytest.mark.parametrize("pp,dp,tp", LAYOUTS)
def test_axes_give_megatron_order_with_tp_fastest(pp, dp, tp):
    """rank = stage x dp x tp + dp_index x tp + tp_index, written out here independently of the mesh."""
    for rank in range(pp * dp * tp):
        m = Mesh(dp=dp, tp=tp, rank=rank, pp=pp)
        s, d, t = rank // (dp * tp), rank % (dp * tp) // tp, rank % tp
        assert (m.stage, m.dp_index, m.tp_index) == (s, d, t)
        assert m.tp_ranks() == tuple(s * dp * tp + d * tp + i for i in range(tp))
        assert m.dp_ranks() == tuple(s * dp * tp + i * tp + t for i in range(dp))
        assert m.pp_ranks() == tuple(i * dp * tp + d * tp + t for i in range(pp))
        assert m.ranks_where(pp=0, tp=0) == tuple(i * tp for i in range(dp))
        assert m.is_leader("tp") == (t == 0) and m.is_leader("dp", "tp") == (d == 0 and t == 0)


@pytest.mark.parametrize("pp,dp,tp", LAYOUTS)
def test_an_extra_axis_of_size_one_changes_nothing(pp, dp, tp):
    """A new axis (say a context-parallel one) is added in the mesh alone: at size 1 every query the code makes
    - indices, peers, groups' ranks, replica leaders, each parameter's layout in the strategy files - is what it
    was without it."""
    cfg = ModelConfig(**tiny_model_kwargs(True, False, 2))
    base_layouts = extra_layouts = None
    for rank in range(pp * dp * tp):
        a = Mesh(dp=dp, tp=tp, rank=rank, pp=pp)
        b = Mesh(dp=dp, tp=tp, rank=rank, pp=pp, extra_axes=(("cp", 1),))
        assert [n for n, _ in b.axes] == ["pp", "dp", "cp", "tp"] and b.index("cp") == 0
        for query in ("stage", "dp_index", "tp_index", "world_size", "stage_size", "is_first_stage",
                      "is_last_stage", "device_axes"):
            assert getattr(a, query) == getattr(b, query), query
        assert (a.tp_ranks(), a.dp_ranks(), a.pp_ranks()) == (b.tp_ranks(), b.dp_ranks(), b.pp_ranks())
        for s, d, t in itertools.product(range(pp), range(dp), range(tp)):
            assert a.rank_at(s, d, t) == b.rank_at(s, d, t)
        assert a.ranks_where(pp=0, tp=0) == b.ranks_where(pp=0, tp=0)
        if tp <= 2 and pp <= 2 and rank == 0:          # the 2-layer model fits these
            base_layouts, extra_layouts = mesh_layouts(cfg, a), mesh_layouts(cfg, b)
    if base_layouts is not None:
        assert base_layouts == extra_layouts


def test_an_extra_axis_of_size_two_sits_between_dp_and_tp():
    m = Mesh(dp=2, tp=2, rank=5, pp=1, extra_axes=(("cp", 2),))      # rank 5 = dp 1, cp 0, tp 1
    assert (m.world_size, m.dp_index, m.index("cp"), m.tp_index) == (8, 1, 0, 1)
    assert m.ranks_along("cp") == (5, 7) and m.tp_ranks() == (4, 5) and m.dp_ranks() == (1, 5)
    assert m.device_axes == (("dp", 2), ("cp", 2), ("tp", 2))


def test_mesh_errors_name_the_axes():
    with pytest.raises(ConfigError, match="pipeline_stage=1 x data_parallel=2 x model_parallel=2"):
        Mesh(dp=2, tp=2, rank=4)
    with pytest.raises(ConfigError, match="used twice"):
        Mesh(dp=2, tp=1, extra_axes=(("dp", 1),))
    with pytest.raises(KeyError, match="no mesh axis"):
        Mesh(dp=2, tp=1).rank_with(ep=0)


def test_the_ep_dispatcher_decides_whether_ep_ranks_share_their_rows():
    """The all-gather dispatcher's EP ranks hold one row group's rows; the all-to-all dispatcher's each their own
    (models/moe.py), so ep leaves the row-replica axes; any other name is refused naming the choices."""
    shared = Mesh(dp=1, tp=2, rank=3, extra_axes=(("ep", 2),))
    distinct = Mesh(dp=1, tp=2, rank=3, extra_axes=(("ep", 2),), ep_dispatcher="alltoall")
    assert shared.row_replica_axes == ("ep", "tp") and distinct.row_replica_axes == ("tp",)
    assert not shared.is_row_leader and not distinct.is_row_leader           # rank 3: tp index 1
    assert Mesh(dp=1, tp=2, rank=2, extra_axes=(("ep", 2),), ep_dispatcher="alltoall").is_row_leader
    with pytest.raises(ConfigError, match=r"ep_dispatcher 'all_to_all': expected one of \['allgather', 'alltoall'\]"):
        Mesh(dp=1, tp=1, extra_axes=(("ep", 2),), ep_dispatcher="all_to_all")


def test_row_shares_count_the_ep_ranks_only_under_the_all_to_all_dispatcher():
    """A stage's rows split over dp (all-gather: the EP ranks share theirs) or over dp x ep (all-to-all), dp outer:
    what the trainer's row split, token-mean denominator and gradient mean read (Mesh.row_ways / row_index)."""
    for rank, want in enumerate([(0, (0, 2)), (0, (1, 3)), (1, (0, 2)), (1, (1, 3))]):     # [dp, ep]
        shared = Mesh(dp=2, tp=1, rank=rank, extra_axes=(("ep", 2),))
        assert (shared.row_axes, shared.row_ways, shared.row_index) == (("dp",), 2, want[0])
        assert shared.row_ranks() == tuple(r for r in range(4) if r % 2 == rank % 2)
        distinct = Mesh(dp=2, tp=1, rank=rank, extra_axes=(("ep", 2),), ep_dispatcher="alltoall")
        assert (distinct.row_axes, distinct.row_ways, distinct.row_index) == (("dp", "ep"), 4, rank)
        assert distinct.row_ranks() == (0, 1, 2, 3)
    tp = Mesh(dp=1, tp=2, rank=3, extra_axes=(("ep", 2),), ep_dispatcher="alltoall")          # [ep, tp]
    assert (tp.row_ways, tp.row_index, tp.row_ranks()) == (2, 1, (1, 3))


def test_one_model_serves_two_roles_only_on_the_same_layout():
    """Mesh.same_layout (trainer/build.py: the policy serves the rollout only then): equal axes are not enough
    when the experts split otherwise (moe_tp_extend_ep) or the EP ranks dispatch otherwise; a rollout on the train
    model's all-to-all dispatcher would have its EP ranks exchange tokens while each decodes to its own end."""
    base = Mesh(dp=1, tp=2, extra_axes=(("ep", 2),))
    assert base.same_layout(Mesh(dp=1, tp=2, extra_axes=(("ep", 2),)))
    assert not base.same_layout(Mesh(dp=1, tp=2, extra_axes=(("ep", 2),), experts_over_tp=True))
    assert not base.same_layout(Mesh(dp=1, tp=2, extra_axes=(("ep", 2),), ep_dispatcher="alltoall"))
    assert not base.same_layout(Mesh(dp=2, tp=2))


@pytest.mark.parametrize("axes, dp, want", [((("ep", 2),), 1, [0]), ((("ep", 2),), 2, [0, 2]), ((), 2, [0, 1])])
def test_gathered_samples_come_once_from_each_row_group(monkeypatch, axes, dp, want):
    """exchange.gather_samples keeps one rank per group of ranks holding the same rows: under an infer ep axis
    the EP peers decode the same prompts, so taking every tp-0 rank counted each sample twice (a train step
    then failed on a (32, 8) vs (16, 1) mask, tests/test_qwen3_moe_ep.py's infer-ep2 run)."""
    import numpy as np
    from mindrlhf.parallel import comm
    from mindrlhf.trainer import exchange
    from mindrlhf.trainer.samples import SampleBatch
    mesh = Mesh(dp=dp, tp=1, rank=0, extra_axes=axes)
    world = tuple(range(mesh.world_size))
    monkeypatch.setattr(comm, "world_ranks", lambda: world)
    # rank r's one sample carries r: the result says whose rows were kept
    monkeypatch.setattr(comm, "all_gather", lambda v, ranks, me: np.stack([np.full_like(v, r) for r in ranks]))
    local = SampleBatch(*(np.zeros((1, 2), np.int64) for _ in range(5)), np.zeros(1, np.int64),
                        np.zeros(1, np.int64))
    assert exchange.gather_samples(local, mesh).prompt_ids[:, 0].tolist() == want


@pytest.mark.parametrize("pp, tp, ep", [(2, 1, 1), (2, 2, 1), (2, 1, 2), (1, 2, 2)])
def test_values_a_replica_holds_alike_are_counted_once_per_replica(monkeypatch, pp, tp, ep):
    """exchange.sum_over_replicas: every rank of a train replica (its stages, TP and EP ranks) holds the aux loss's
    expert counts alike; one of them contributes. Counting each pipeline stage doubled the counts and the token
    total under pp2, halving the aux gradient (tests/test_qwen3_moe_ep.py's pp2 run with the aux loss)."""
    import numpy as np
    from mindrlhf.parallel import comm
    from mindrlhf.trainer import exchange
    world = tuple(range(pp * 2 * ep * tp))
    monkeypatch.setattr(comm, "world_ranks", lambda: world)
    sent = {}
    monkeypatch.setattr(comm, "all_reduce_sum", lambda arr, ranks: sent.setdefault(len(sent), arr))
    for rank in world:
        mesh = Mesh(dp=2, tp=tp, pp=pp, rank=rank, extra_axes=(("ep", ep),) if ep > 1 else ())
        exchange.sum_over_replicas([1.0], mesh)
    assert sum(float(a[0]) for a in sent.values()) == 2.0          # dp 2: two replicas, each counted once
