"""The latency-targeted budget on synthetic cost curves: converges, holds the target, adapts."""
from __future__ import annotations

from evenflow.daemon.engine.budget import AdaptiveBudget, FixedBudget, StepCost


def cost(coef, decodes, prefill, context):
    a, b, c, d = coef
    return a + b * decodes + c * prefill + d * context


def simulate(policy, coef_at, steps=300, decodes=4, prompt=100_000, ctx0=500):
    """4 streams decoding while a long prompt is ingested; returns (chunk, seconds) per step."""
    done, out = 0, []
    for i in range(steps):
        coef = coef_at(i)
        chunk = policy.prefill_budget(decodes, decodes * ctx0, done)
        context = decodes * ctx0 + done + chunk
        t = cost(coef, decodes, chunk, context)
        policy.observe(StepCost(decodes, chunk, context, t))
        out.append((chunk, t))
        done += chunk
        assert done < prompt
    return out


CPU = (0.020, 0.004, 0.0036, 0.000002)  # ~36 ms for 4 decodes, 3.6 ms per prompt token (this machine's order)


def test_converges_and_never_exceeds_the_target_once_fitted():
    pol = AdaptiveBudget(150, max_tokens=2048, tile=16, margin=0.92)
    trace = simulate(pol, lambda i: CPU)
    assert pol.coef is not None
    fitted_at = next(i for i in range(len(trace)) if i >= 8 and pol.coef is not None)
    late = trace[40:]
    assert all(t <= 0.150 for chunk, t in late)
    # it sits on the frontier: the largest tile-aligned chunk under the margin
    a, b, c, d = CPU
    assert all(chunk % 16 == 0 and chunk >= 16 for chunk, _ in late)
    best = max(chunk for chunk, _ in late)
    assert cost(CPU, 4, best + 16, 4 * 500 + 16 * 0 + best + 16) > 0.92 * 0.150 * 0.98 or best >= 2048 - 4
    assert fitted_at < 40


def test_floor_keeps_ingestion_moving_when_the_target_is_unreachable():
    pol = AdaptiveBudget(30, max_tokens=2048)  # 4 decodes alone take ~36 ms > 30 ms
    trace = simulate(pol, lambda i: CPU, steps=100)
    assert all(chunk >= 16 for chunk, _ in trace)
    assert all(chunk == 16 for chunk, _ in trace[30:])


def test_adapts_when_the_cost_changes():
    pol = AdaptiveBudget(300, max_tokens=2048, tile=1)
    slow = (0.020, 0.004, 0.0072, 0.000002)
    trace = simulate(pol, lambda i: CPU if i < 150 else slow, steps=400)
    before = trace[140][0]
    after = trace[399][0]
    assert after < before * 0.7
    assert all(t <= 0.300 for _, t in trace[300:])


def test_cpu_tile_one_sits_on_the_frontier():
    pol = AdaptiveBudget(150, max_tokens=2048, tile=1, margin=1.0)
    trace = simulate(pol, lambda i: CPU, steps=120)
    for chunk, t in trace[40:]:
        assert t <= 0.150 + 1e-9
        assert chunk == 16 or t + 0.0036 + 0.000002 > 0.150  # one more token would not fit


def test_full_speed_when_nobody_is_streaming_and_fixed_policy():
    pol = AdaptiveBudget(150, max_tokens=2048)
    assert pol.prefill_budget(0, 0) == 2048
    assert FixedBudget(256).prefill_budget(4, 100) == 252
