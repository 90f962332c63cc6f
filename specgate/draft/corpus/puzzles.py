"""Structured tasks whose text is built from numbers and schemas: arithmetic,
unit conversions, sorting, SQL queries and regular expressions."""

from __future__ import annotations

import random

from specgate.draft.corpus.mixing import Maker, Row, distinct

SOURCE = "puzzles"

TABLES = {"orders": ["id", "customer_id", "total", "created_at", "status"],
          "customers": ["id", "name", "city", "signed_up"], "products": ["id", "name", "price", "stock"],
          "employees": ["id", "name", "department", "salary", "hired"],
          "books": ["id", "title", "author", "year", "pages"], "trips": ["id", "driver", "km", "started", "fare"]}
SQL = ["Write an SQL query that returns every row of {t} where {c} is greater than {n}.",
       "Write an SQL query that counts the rows of {t} grouped by {c}.",
       "Write an SQL query that returns the {n} rows of {t} with the highest {c}.",
       "Given a table {t}({cols}), write a query for the average {c}.",
       "Explain what this SQL does: SELECT {c}, COUNT(*) FROM {t} GROUP BY {c} HAVING COUNT(*) > {n};"]
REGEX = [("a UK-style postcode", "SW1A 1AA"), ("a date in YYYY-MM-DD form", "2024-03-09"),
         ("a hexadecimal colour code", "#1a2b3c"), ("an email address", "name@example.org"),
         ("a time in 24-hour HH:MM form", "17:45"), ("a whole number with optional minus sign", "-42"),
         ("a word that starts with a capital letter", "Paris"), ("a semantic version number", "1.12.3")]
REGEX_ASK = ["Write a regular expression that matches {d}, for example {e}.",
             "Explain a regular expression that matches {d} (like {e}), part by part.",
             "Write a Python snippet that uses re to check whether a string is {d}, such as {e}."]
UNITS = [("kilometres", "miles", "km"), ("kilograms", "pounds", "kg"), ("litres", "gallons", "l"),
         ("degrees Celsius", "degrees Fahrenheit", "C"), ("metres", "feet", "m"), ("hours", "minutes", "h")]


def arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(2, 20)
    ask = rng.choice([f"What is {a} + {b} * {c}? Show the steps.", f"Compute {a} - {b} + {c}.",
                      f"What is {c} percent of {a * 10}?", f"Is {a} a prime number? Explain briefly.",
                      f"What is the remainder when {a} is divided by {b}?",
                      f"Round {a / b:.4f} to two decimal places.", f"What is {b} squared minus {c}?"])
    return "math/greedy", ask


def conversion(rng: random.Random) -> tuple[str, str]:
    one, other, _ = rng.choice(UNITS)
    n = rng.randint(1, 500)
    return "math/greedy", rng.choice([f"Convert {n} {one} to {other}.", f"How many {other} are {n} {one}?",
                                      f"Explain how to convert {one} to {other}, using {n} as an example."])


def sorting(rng: random.Random) -> tuple[str, str]:
    numbers = [rng.randint(-50, 200) for _ in range(rng.randint(4, 9))]
    return "math/greedy", rng.choice([f"Sort these numbers from smallest to largest: {numbers}",
                                      f"What are the largest and smallest of {numbers}?",
                                      f"What is the sum of {numbers}?", f"What is the median of {numbers}?"])


def sql(rng: random.Random) -> tuple[str, str]:
    table = rng.choice(sorted(TABLES))
    cols = TABLES[table]
    return "code/greedy", rng.choice(SQL).format(t=table, c=rng.choice(cols[1:]), n=rng.randint(2, 100),
                                                 cols=", ".join(cols))


def regex(rng: random.Random) -> tuple[str, str]:
    described, example = rng.choice(REGEX)
    return "code/greedy", rng.choice(REGEX_ASK).format(d=described, e=example)


KINDS: tuple[tuple[Maker, int], ...] = (
    (arithmetic, 30), (conversion, 15), (sorting, 15), (sql, 25), (regex, 15))


def make(rng: random.Random, count: int) -> list[Row]:
    return distinct(rng, count, KINDS, SOURCE)
