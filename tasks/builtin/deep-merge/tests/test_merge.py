import copy
import json

from config_merge import deep_merge, merge_files


def test_example_files():
    assert merge_files("/app/configs/base.json", "/app/configs/prod.json") == {
        "server": {"host": "0.0.0.0", "port": 443, "tls": {"enabled": True, "cert": "/etc/cert.pem"}},
        "plugins": ["auth", "metrics"],
    }


def test_inputs_not_modified():
    base = {"a": {"b": [1]}, "c": 1}
    override = {"a": {"b": {"$append": [2]}, "d": None}, "c": None}
    before = (copy.deepcopy(base), copy.deepcopy(override))
    merged = deep_merge(base, override)
    assert merged == {"a": {"b": [1, 2]}}
    assert (base, override) == before
    merged["a"]["b"].append(3)
    assert base["a"]["b"] == [1]


def test_lists_replaced_and_scalars_override_dicts():
    assert deep_merge({"x": [1, 2], "y": {"z": 1}}, {"x": [3], "y": 5}) == {"x": [3], "y": 5}


def test_three_files_left_to_right(tmp_path):
    paths = []
    for i, data in enumerate([{"a": 1, "l": [0]}, {"a": 2, "l": {"$append": [1]}}, {"b": {"c": 3}, "l": {"$append": [2]}}]):
        p = tmp_path / f"{i}.json"
        p.write_text(json.dumps(data))
        paths.append(str(p))
    assert merge_files(*paths) == {"a": 2, "l": [0, 1, 2], "b": {"c": 3}}
