"""jsonio writes the document `json` would (orjson where that is the same), and reads both."""

from __future__ import annotations

import json
import math
import random

from uniagent import jsonio


def test_rows_round_trip_as_with_json() -> None:
    rng = random.Random(0)
    row = {
        "instance_id": "pkg__repo-1",
        "segments": [
            {
                "prompt_ids": [rng.randrange(50000) for _ in range(500)],
                "response_logprobs": [-rng.random() * 5 for _ in range(300)],
                "response_mask": [rng.randrange(2) for _ in range(300)],
                "drift": None,
            }
        ],
        "text": 'naïve 你好 "quoted" \\ \n\t',
        "reward": {"value": 1.0, "resolved": True},
        3: "int key",
    }
    text = jsonio.dumps(row)
    assert json.loads(text) == json.loads(json.dumps(row, ensure_ascii=False))
    assert "你好" in text  # not escaped, as ensure_ascii=False
    assert jsonio.loads(text) == json.loads(text)


def test_non_finite_floats_keep_their_json_spelling() -> None:
    """orjson would write null for -inf: a -inf logprob must not come back as None."""
    for value in (-math.inf, math.inf):
        row = {"response_logprobs": [-0.5, value], "drift": None}
        text = jsonio.dumps(row)
        assert jsonio.loads(text)["response_logprobs"][1] == value
    nan = jsonio.loads(jsonio.dumps({"x": [[1.0, math.nan]]}))["x"][0][1]
    assert math.isnan(nan)


def test_types_orjson_refuses_go_through_json() -> None:
    assert jsonio.loads(jsonio.dumps({"big": 2**70})) == {"big": 2**70}
