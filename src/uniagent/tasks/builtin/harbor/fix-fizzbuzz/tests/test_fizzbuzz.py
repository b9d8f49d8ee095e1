import sys

sys.path.insert(0, "/app")

from fizzbuzz import fizzbuzz


def test_plain():
    assert [fizzbuzz(n) for n in (1, 2, 4, 7)] == ["1", "2", "4", "7"]


def test_fizz_and_buzz():
    assert fizzbuzz(9) == "Fizz" and fizzbuzz(10) == "Buzz"


def test_fizzbuzz():
    assert fizzbuzz(15) == "FizzBuzz" and fizzbuzz(45) == "FizzBuzz"
