"""Exposition parsing: every problem is named by its line; nothing but ExpositionError ever escapes."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import VLLM_DIR, sample_lines
from tuner.collect.catalogue import lookup
from tuner.collect.exposition import decode_body, parse_exposition
from tuner.errors import ExpositionError

RECORDED = VLLM_DIR / "metrics_after_load.txt"


def _recorded() -> list[str]:
    return RECORDED.read_text(encoding="utf-8").split("\n")


def _line_of(lines: list[str], prefix: str) -> int:
    """1-based number of the first line starting with ``prefix``."""
    return next(i for i, line in enumerate(lines, start=1) if line.startswith(prefix))


def test_recorded_exposition_parses_without_problems() -> None:
    text = RECORDED.read_text(encoding="utf-8")
    parsed = parse_exposition(text)
    assert parsed.problems == []
    assert parsed.sample_count == len(sample_lines(text))  # every sample line, kept or not
    # each kept sample points at the line it came from
    lines = text.split("\n")
    for s in parsed.samples:
        assert lines[s.line_no - 1].startswith(s.spec.name), (s.spec.name, s.line_no)


def test_malformed_line_is_reported_with_its_number_and_text() -> None:
    lines = _recorded()
    n = _line_of(lines, "vllm:num_requests_waiting{")
    lines[n - 1] = lines[n - 1].replace("}", "", 1)  # unclosed label set
    with pytest.raises(ExpositionError) as info:
        parse_exposition("\n".join(lines))
    assert info.value.line_no == n
    assert info.value.line == lines[n - 1]
    assert str(info.value).startswith(f"line {n}: ")


def test_value_that_is_not_a_number_is_reported_with_its_line() -> None:
    lines = _recorded()
    n = _line_of(lines, "vllm:prompt_tokens_total{")
    lines[n - 1] = lines[n - 1].rsplit(" ", 1)[0] + " lots"
    with pytest.raises(ExpositionError) as info:
        parse_exposition("\n".join(lines))
    assert (info.value.line_no, info.value.line) == (n, lines[n - 1])


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("garbage garbage garbage\n", id="garbage"),
        pytest.param("<!DOCTYPE html>\n<html><body><h1>502 Bad Gateway</h1></body></html>\n", id="html"),
        pytest.param('{"object": "error", "message": "Not Found", "code": 404}\n', id="json"),
        pytest.param('[{"id": 0, "n_ctx": 256}]', id="json-list"),
    ],
)
def test_a_body_that_is_not_an_exposition_is_rejected_at_line_1(body: str) -> None:
    with pytest.raises(ExpositionError) as info:
        parse_exposition(body)
    assert info.value.line_no == 1
    assert info.value.line == body.split("\n")[0]


def test_duplicate_series_names_the_second_line() -> None:
    lines = _recorded()
    n = _line_of(lines, "vllm:kv_cache_usage_perc{")
    lines.insert(n, lines[n - 1])  # the same series again, on line n + 1
    with pytest.raises(ExpositionError) as info:
        parse_exposition("\n".join(lines))
    assert info.value.reason == "duplicate series"
    assert (info.value.line_no, info.value.line) == (n + 1, lines[n - 1])


def test_duplicate_series_with_labels_in_another_order_is_still_a_duplicate() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        'vllm:num_requests_running{model_name="m",engine="0"} 2\n'
    )
    with pytest.raises(ExpositionError) as info:
        parse_exposition(text)
    assert info.value.line_no == 3


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_non_finite_catalogue_values_are_dropped_and_named(bad: str) -> None:
    lines = _recorded()
    n = _line_of(lines, "vllm:kv_cache_usage_perc{")
    lines[n - 1] = lines[n - 1].rsplit(" ", 1)[0] + f" {bad}"
    m = _line_of(lines, "vllm:time_to_first_token_seconds_sum{")
    lines[m - 1] = lines[m - 1].rsplit(" ", 1)[0] + f" {bad}"
    parsed = parse_exposition("\n".join(lines))

    assert not [s for s in parsed.samples if s.line_no in (n, m)]
    shown = bad  # the problem spells the value as the exposition format does
    assert parsed.problems == [
        f"line {n}: vllm:kv_cache_usage_perc is {shown}; sample dropped",
        f"line {m}: vllm:time_to_first_token_seconds_sum is {shown}; sample dropped",
    ]
    # every other catalogue sample is kept
    assert len(parsed.samples) == len(parse_exposition(RECORDED.read_text(encoding="utf-8")).samples) - 2


def test_non_finite_values_outside_the_catalogue_are_not_problems() -> None:
    text = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total NaN\n"
    parsed = parse_exposition(text)
    assert (parsed.samples, parsed.problems, parsed.sample_count) == ([], [], 1)


def test_samples_without_help_or_type_are_read_with_one_problem_per_metric() -> None:
    text = (
        "\n".join(
            [
                'vllm:num_requests_running{engine="0",model_name="m"} 3',
                'vllm:num_requests_running{engine="1",model_name="m"} 4',
                'vllm:prompt_tokens_total{engine="0",model_name="m"} 1234',
                'vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 2',
                'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5',
                'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 5',
                'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 7.5',
            ]
        )
        + "\n"
    )
    parsed = parse_exposition(text)

    read = [
        (s.spec.name, s.part, s.labels.get("engine"), s.labels.get("le"), s.value, s.line_no) for s in parsed.samples
    ]
    assert read == [
        ("vllm:num_requests_running", "value", "0", None, 3.0, 1),
        ("vllm:num_requests_running", "value", "1", None, 4.0, 2),
        ("vllm:prompt_tokens_total", "value", "0", None, 1234.0, 3),
        ("vllm:e2e_request_latency_seconds", "bucket", "0", "1.0", 2.0, 4),
        ("vllm:e2e_request_latency_seconds", "bucket", "0", "+Inf", 5.0, 5),
        ("vllm:e2e_request_latency_seconds", "count", "0", None, 5.0, 6),
        ("vllm:e2e_request_latency_seconds", "sum", "0", None, 7.5, 7),
    ]
    assert parsed.problems == [
        "line 1: vllm:num_requests_running has no TYPE; read as gauge (catalogue)",
        "line 3: vllm:prompt_tokens_total has no TYPE; read as counter (catalogue)",
        "line 4: vllm:e2e_request_latency_seconds_bucket has no TYPE; read as histogram (catalogue)",
    ]


def test_non_utf8_body_names_its_line() -> None:
    lines = [line.encode() for line in _recorded()]
    n = _line_of(_recorded(), "vllm:num_requests_running{")
    lines[n - 1] = lines[n - 1].replace(b'model_name="', b'model_name="\xff\xfe', 1)
    with pytest.raises(ExpositionError) as info:
        decode_body(b"\n".join(lines))
    assert info.value.line_no == n
    assert info.value.line is not None and info.value.line.startswith("vllm:num_requests_running{")
    assert "not UTF-8" in info.value.reason


def test_utf8_body_decodes_unchanged() -> None:
    body = RECORDED.read_bytes()
    assert decode_body(body) == body.decode("utf-8")


# ---- arbitrary text -----------------------------------------------------------------------------

_LINE_LIKE = st.sampled_from(
    [
        "# HELP vllm:num_requests_running Number of requests running.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 1',
        "vllm:num_requests_running 2",
        "# TYPE vllm:prompt_tokens_total counter",
        "vllm:prompt_tokens_total 17",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3',
        "vllm:time_to_first_token_seconds_count 3",
        "vllm:kv_cache_usage_perc NaN",
        'vllm:cache_config_info{block_size="16"} 1',
        "ray_vllm:num_requests_waiting 4",
        "llamacpp:requests_processing 1 1700000000000",
        "process_start_time_seconds 1.7e9",
        "# EOF",
        "#",
        "",
        " ",
        "\r",
        "\t",
    ]
)
_FRAGMENT = st.text(alphabet=st.sampled_from(list(' \t\r#{}="\\,_:.+-eEINFnafx01\u00e9\u2028\x00')), max_size=20)
_ARBITRARY = st.lists(st.one_of(_LINE_LIKE, _FRAGMENT, st.text(max_size=30)), max_size=12).map("\n".join)


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ARBITRARY)
def test_arbitrary_text_raises_nothing_but_exposition_error(text: str) -> None:
    try:
        parsed = parse_exposition(text)
    except ExpositionError as exc:
        if exc.line_no is not None:  # a named line is really that line of the body
            assert text.split("\n")[exc.line_no - 1] == exc.line
        return
    lines = text.split("\n")
    # the line numbering relies on one sample per non-blank, non-comment line
    assert parsed.sample_count == sum(1 for line in lines if line.strip() and not line.lstrip().startswith("#"))
    for s in parsed.samples:
        assert lookup(lines[s.line_no - 1].split("{")[0].split()[0]) is not None
        assert math.isfinite(s.value) or s.spec.kind == "info"


def test_a_number_too_large_for_a_float_is_read_as_inf_and_dropped() -> None:
    """prometheus_client keeps "999...9" as an int that float() cannot take (OverflowError); Prometheus reads it
    as +Inf, so tuner drops it like any non-finite value and names the line, instead of crashing."""
    parsed = parse_exposition("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running " + "9" * 400 + "\n")
    assert parsed.samples == []
    assert parsed.problems == ["line 2: vllm:num_requests_running is +Inf; sample dropped"]
