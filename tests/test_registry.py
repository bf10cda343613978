"""The registry is the one home of what the lab knows about an impl: one stage vocabulary (the replay's
stage names), tags the tools ask by, and the order the recorded run and the README's tables follow."""
import pytest

from dsv4lab import registry, stages


@pytest.mark.parametrize("op", registry.OPS)
def test_every_impl_names_a_stage_of_the_replay_or_none(op):
    for impl in registry.registered(op):
        assert impl.stage in (*stages.STAGE_BY_NAME, ""), (impl.name, impl.stage)
        assert impl.tags <= set(registry.TAGS), (impl.name, impl.tags)


def test_every_stage_runs_registered_impls_that_stand_for_it_or_an_earlier_stage():
    for s in stages.STAGES:
        for op, name in (("sparse_decode", s.decode_impl), ("indexer_topk", s.indexer_impl)):
            assert registry.impl_info(op, name).stage in stages.STAGE_BY_NAME, (s.name, name)


def test_tags_select_and_the_recorded_order_starts_at_the_baseline():
    recorded = registry.registered(tag="recorded")
    (base,) = registry.registered(tag="baseline")
    assert recorded[0] is base and all("recorded" in i.tags for i in recorded)
    assert registry.impls(tag="simt") == ["simt"] and "reference" not in registry.impls(tag="recorded")
    with pytest.raises(ValueError, match="tag must be one of"):
        registry.impls(tag="fast")
    with pytest.raises(ValueError, match="impl must be one of"):
        registry.impl_info("sparse_decode", "fast")


def test_a_dispatcher_reads_as_the_impl_it_runs():
    auto = next(i for i in registry.registered(tag="dispatcher"))
    ran = auto.runs(1, 64, 512)
    assert ran is not auto and ran.heads_per_read(1, 64, 512) == auto.heads_per_read(1, 64, 512)
    assert auto.launch is None and ran.launch is not None


def test_a_peer_is_sglang_code_and_one_kernel_stands_beyond_the_story():
    for op in registry.OPS:
        for impl in registry.registered(op):
            assert ("peer" in impl.tags) == ("sglang" in impl.needs), (op, impl.name)
    (beyond,) = registry.registered(tag="beyond_story")
    assert beyond.stage == "" and "tensor_core" in beyond.tags
