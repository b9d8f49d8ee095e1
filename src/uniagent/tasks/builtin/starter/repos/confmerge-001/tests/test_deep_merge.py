from confmerge import deep_merge


def test_nested_keys_merge():
    base = {"a": {"x": 1, "y": 2}, "b": 1}
    assert deep_merge(base, {"a": {"y": 3}}) == {"a": {"x": 1, "y": 3}, "b": 1}


def test_non_mapping_replaces():
    assert deep_merge({"a": {"x": 1}}, {"a": 5}) == {"a": 5}


def test_lists_are_replaced_not_extended():
    assert deep_merge({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
