"""Seeded workloads: matched means, arrivals, CSV upload with per-row errors and size limits."""

from __future__ import annotations

import numpy as np
import pytest

from lab.serving.workloads import (
    MAX_CSV_BYTES,
    MAX_REQUESTS,
    LengthDist,
    WorkloadError,
    from_preset,
    generate,
    parse_csv,
    workload_stats,
)


@pytest.mark.parametrize("name, prompt_mean, output_mean", [("sharegpt", 161, 338),
                                                            ("alpaca", 19, 58)])
def test_presets_match_the_published_means(name, prompt_mean, output_mean):
    d = workload_stats(from_preset(name, 8000, seed=1))
    assert d["prompt_mean"] == pytest.approx(prompt_mean, rel=0.06)
    assert d["output_mean"] == pytest.approx(output_mean, rel=0.06)


def test_same_seed_same_workload():
    a = from_preset("sharegpt", 50, seed=7, rate=2.0)
    assert a == from_preset("sharegpt", 50, seed=7, rate=2.0)
    assert a != from_preset("sharegpt", 50, seed=8, rate=2.0)


def test_fixed_uniform_and_clipping():
    reqs = generate(200, LengthDist("fixed", mean=33), LengthDist("uniform", low=5, high=9),
                    seed=0, max_tokens=7)
    assert {r.prompt_len for r in reqs} == {33}
    assert {r.output_len for r in reqs} == {5, 6, 7}  # 8 and 9 clipped to max_tokens
    assert all(r.max_tokens == 7 for r in reqs)


def test_poisson_arrivals():
    reqs = generate(4000, LengthDist("fixed", mean=1), LengthDist("fixed", mean=1), seed=3,
                    rate=20.0)
    times = np.array([r.arrival_s for r in reqs])
    assert (np.diff(times) >= 0).all()
    assert np.diff(times).mean() == pytest.approx(1 / 20, rel=0.06)
    assert all(r.arrival_s == 0 for r in from_preset("alpaca", 10))


@pytest.mark.parametrize("bad", [dict(num_requests=0), dict(num_requests=MAX_REQUESTS + 1),
                                 dict(max_tokens=0), dict(rate=-1.0)])
def test_generator_limits(bad):
    args = dict(num_requests=5, prompt=LengthDist(), output=LengthDist(), max_tokens=64)
    with pytest.raises(WorkloadError):
        generate(**{**args, **bad})


def test_csv_with_header_and_arrivals():
    reqs = parse_csv("prompt_len,output_len,arrival_s\n10,5,0.5\n20,7,0.1\n\n30,2\n")
    assert [(r.prompt_len, r.output_len, r.arrival_s) for r in reqs] == [
        (30, 2, 0.0), (20, 7, 0.1), (10, 5, 0.5)]  # ordered by arrival
    assert [r.req_id for r in reqs] == [0, 1, 2] and all(r.max_tokens == 7 for r in reqs)


def test_csv_errors_name_every_bad_row():
    with pytest.raises(WorkloadError) as err:
        parse_csv(b"10,5\nabc,5\n10,0\n10,5,-1\n1,2,3,4\n10,5,soon\n")
    text = str(err.value)
    for expected in ("row 2: prompt_len", "row 3: output_len", "row 4: arrival_s",
                     "row 5: expected 2 or 3 values", "row 6: arrival_s must be a number"):
        assert expected in text
    assert "row 1" not in text


def test_csv_limits():
    with pytest.raises(WorkloadError, match="limit is"):
        parse_csv("1,1\n" * (MAX_CSV_BYTES // 4 + 1))
    with pytest.raises(WorkloadError, match="requests"):
        parse_csv("1,1\n" * (MAX_REQUESTS + 1))
    with pytest.raises(WorkloadError, match="no rows"):
        parse_csv("prompt_len,output_len\n")
    with pytest.raises(WorkloadError, match="UTF-8"):
        parse_csv(b"\xff\xfe1,2")
    with pytest.raises(WorkloadError, match="and 2 more bad rows"):
        parse_csv("x,1\n" * 12)
    with pytest.raises(WorkloadError, match="exceeds max_tokens"):
        parse_csv("1,50\n", max_tokens=10)
