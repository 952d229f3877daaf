import pytest

from compose2sif.units import format_duration, go_float, parse_bytes, parse_duration


@pytest.mark.parametrize("text,expected", [
    ("90s", "1m30s"), ("1500ms", "1.5s"), ("1h", "1h0m0s"), ("1m30s", "1m30s"), ("0", "0s"),
    ("1d", "24h0m0s"), ("300us", "300µs"), ("2w", "336h0m0s"), ("1.5h", "1h30m0s"), ("10ns", "10ns"),
])
def test_durations_print_like_go(text, expected):
    assert format_duration(parse_duration(text)) == expected


@pytest.mark.parametrize("bad", ["", "5 minutes", "10", "1x", "s"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_sizes_and_numbers():
    assert parse_bytes("1gb") == 1 << 30
    assert parse_bytes("64m") == 64 << 20
    assert parse_bytes(1000) == 1000
    assert parse_bytes("1.5k") == 1536
    with pytest.raises(ValueError):
        parse_bytes("lots")
    assert [go_float(v) for v in (1.0, 1e3, 1e21, 1e-05, 0.5)] == ["1", "1000", "1e+21", "1e-05", "0.5"]
