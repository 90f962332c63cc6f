"""The routing benchmark's collapse measure reads the drafting pools off the policy, whatever their names."""

from __future__ import annotations

from bench.routing import outcome, stack, traces
from specgate.ops.measure import Sample


def test_the_collapse_exit_counts_every_drafting_pool_by_kind() -> None:
    trace = traces.make("collapse", seed=1)
    collapsed = set(trace.controls[0].body["domain_quality"])
    after = [r for r in trace.requests if r.at >= trace.controls[0].at and r.prompt.domain in collapsed]
    late = after[2]  # the collapsed domain's first two requests after the collapse went to the drafting pool
    samples = [Sample("gateway", 0, True, 1.0, output_tokens=10,
                      pool="drafting" if r in after and r.at < late.at else "standard")
               for r in trace.requests]
    pair = stack.default_policy()
    pair["pools"]["drafting"] = {**pair["pools"].pop("speculative"), "kind": "dynamic",
                                 "speculation_schedule": [[1, 16, 4], [17, 17, 0]]}
    assert stack.drafting_pools(stack.default_policy()) == {"speculative"}
    assert stack.drafting_pools(pair) == {"drafting"}
    found = outcome.collapse_exit(trace, samples, stack.drafting_pools(pair))
    assert found["to_speculative_after"] == 2
    assert found["out_after_s"] == late.at - trace.controls[0].at
    unseen = outcome.collapse_exit(trace, samples, stack.drafting_pools(stack.default_policy()))
    assert unseen["to_speculative_after"] == 0  # read as the speculative pool alone, the exit was missed
