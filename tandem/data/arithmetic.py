"""The embedded tiny world's task: arithmetic word problems with verifiable integer answers.

Each problem is a short story: a start quantity, then a chain of operations (gain, loss,
multiply, share equally), then a question. Its worked solution writes one reasoning step per
operation, steps separated by a blank line (``\\n\\n``, so the reasoning-step handoff schedule has
steps to hand over), and ends in ``\\boxed{answer}``.

Everything is deterministic from a seed. Wording is drawn from many templates, names and items
so that the tokenizer trained on the corpus sees varied text, but the arithmetic is what decides
the answer: each row also carries ``expression``, the chain written as plain arithmetic, so tests
can recompute every answer independently of the story.

What this file leaves out: tokenization and chat formatting (``tandem.data.prompts``), and
loading real datasets (``tandem.data.sources``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import datasets

from tandem.rewards.extract import extract_boxed

OPERATIONS = ("add", "sub", "mul", "div")

NAMES = (
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Iris",
    "Jonas",
    "Kira",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tariq",
    "Uma",
    "Victor",
    "Wen",
    "Ximena",
    "Yusuf",
    "Zoe",
    "Amara",
    "Bruno",
    "Carmen",
    "Dmitri",
    "Elena",
    "Felix",
    "Hana",
    "Ivan",
    "Julia",
    "Kofi",
    "Lena",
    "Mateo",
    "Nadia",
    "Oscar",
    "Pablo",
    "Rina",
    "Theo",
    "Aisha",
    "Bjorn",
    "Camille",
    "Dara",
    "Esther",
    "Fatima",
    "Gustavo",
    "Hiroshi",
    "Ingrid",
    "Jamal",
    "Keiko",
    "Lucia",
    "Malik",
    "Nora",
    "Omar",
    "Petra",
    "Rafael",
    "Sofia",
    "Tomas",
    "Ursula",
    "Vera",
    "Walter",
    "Yara",
    "Zain",
    "Anton",
    "Beatriz",
    "Cyrus",
    "Delia",
    "Emil",
    "Freya",
    "Gideon",
    "Helga",
    "Isaac",
    "Joy",
    "Kamal",
    "Leila",
    "Marco",
    "Nina",
    "Otto",
)
ITEMS = (
    "apples",
    "marbles",
    "stickers",
    "coins",
    "books",
    "pencils",
    "cookies",
    "stamps",
    "shells",
    "cards",
    "beads",
    "tickets",
    "balloons",
    "candles",
    "buttons",
    "flowers",
    "eggs",
    "rocks",
    "toy cars",
    "crayons",
    "lemons",
    "muffins",
    "paper cranes",
    "ribbons",
    "seeds",
    "bricks",
    "postcards",
    "jars of jam",
    "bottles",
    "plums",
    "feathers",
    "batteries",
    "keys",
    "nails",
    "oranges",
    "peaches",
    "carrots",
    "potatoes",
    "tomatoes",
    "cupcakes",
    "sandwiches",
    "kites",
    "puzzles",
    "comics",
    "magnets",
    "notebooks",
    "erasers",
    "gloves",
    "socks",
    "hats",
    "scarves",
    "mugs",
    "plates",
    "spoons",
    "forks",
    "candies",
    "pretzels",
    "walnuts",
    "acorns",
    "pebbles",
    "bananas",
    "cherries",
    "grapes",
    "melons",
    "pears",
    "onions",
    "peppers",
    "blankets",
    "pillows",
    "lanterns",
    "whistles",
    "drums",
    "guitars",
    "paintings",
    "photos",
    "letters",
    "envelopes",
    "boxes of tea",
    "bags of rice",
    "loaves of bread",
    "pies",
    "donuts",
    "bagels",
)

START = (
    "{name} has {n} {item}.",
    "{name} starts the day with {n} {item}.",
    "There are {n} {item} in {name}'s box.",
    "{name} owns {n} {item}.",
    "At first, {name} has {n} {item}.",
    "{name} keeps {n} {item} on a shelf.",
    "{name} collected {n} {item} last week.",
)
STEP_TEXT = {
    "add": (
        "Then {name} buys {k} more.",
        "A friend gives {name} {k} more {item}.",
        "{name} finds {k} more {item}.",
        "Later, {name} gets {k} extra {item}.",
        "Next, {k} more {item} arrive.",
        "{name} wins {k} more {item} in a game.",
    ),
    "sub": (
        "Then {name} gives away {k} of them.",
        "{name} loses {k} {item}.",
        "{name} sells {k} {item} at the market.",
        "Next, {k} of the {item} break.",
        "{name} uses {k} {item}.",
        "Later, {name} gives {k} {item} to a neighbour.",
    ),
    "mul": (
        "Then the number of {item} becomes {k} times as large.",
        "{name} multiplies the pile by {k}.",
        "Next, {name} ends up with {k} times as many {item}.",
        "A machine makes the count {k} times bigger.",
    ),
    "div": (
        "Then {name} splits the {item} equally into {k} groups and keeps one group.",
        "{name} shares the {item} equally among {k} friends and keeps one share.",
        "Next, {name} keeps only one of {k} equal parts.",
    ),
}
QUESTION = (
    "How many {item} does {name} have now?",
    "How many {item} are left?",
    "What is the final number of {item}?",
    "How many {item} does {name} end with?",
    "Count the {item} at the end. How many are there?",
)
SOLUTION_START = (
    "{name} starts with {n} {item}.",
    "At the start there are {n} {item}.",
    "We begin with {n} {item}.",
)
SOLUTION_STEP = {
    "add": (
        "Adding {k} gives {a} + {k} = {r} {item}.",
        "After getting {k} more, there are {a} + {k} = {r}.",
        "{a} + {k} = {r}, so now there are {r} {item}.",
    ),
    "sub": (
        "Taking away {k} leaves {a} - {k} = {r} {item}.",
        "After losing {k}, there are {a} - {k} = {r}.",
        "{a} - {k} = {r}, so {r} {item} remain.",
    ),
    "mul": (
        "Multiplying by {k} gives {a} * {k} = {r} {item}.",
        "{k} times as many means {a} * {k} = {r}.",
        "{a} * {k} = {r}, so now there are {r} {item}.",
    ),
    "div": (
        "Splitting into {k} equal parts gives {a} / {k} = {r} {item}.",
        "One of {k} equal shares is {a} / {k} = {r}.",
        "{a} / {k} = {r}, so {r} {item} are kept.",
    ),
}
SOLUTION_END = (
    "The answer is \\boxed{{{r}}}.",
    "So the final count is \\boxed{{{r}}}.",
    "Therefore, the answer is \\boxed{{{r}}}.",
)
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
# A guess with no working: some of the base model's fine-tuning answers take this form, so that
# the base knows a careful and a hasty way to answer and RL has a real choice to learn.
HASTY_SOLUTION = "Guessing quickly, the answer is \\boxed{{{r}}}."


@dataclass(frozen=True)
class Difficulty:
    """How hard the problems are.

    Args:
        min_ops: fewest operations after the start quantity.
        max_ops: most operations after the start quantity.
        digits: most digits of the start quantity and of added or subtracted amounts.
        max_factor: largest multiplier or divisor (at least 2).
        operations: which operations may appear (subset of add, sub, mul, div).
    """

    min_ops: int = 2
    max_ops: int = 3
    digits: int = 2
    max_factor: int = 5
    operations: tuple[str, ...] = field(default=("add", "sub", "mul", "div"))

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(
                f"difficulty min_ops ({self.min_ops}) and max_ops ({self.max_ops}) must satisfy "
                "1 <= min_ops <= max_ops. Set min_ops to at least 1 and max_ops >= min_ops."
            )
        if not 1 <= self.digits <= 6:
            raise ValueError(f"difficulty digits ({self.digits}) must be in 1..6.")
        if self.max_factor < 2:
            raise ValueError(f"difficulty max_factor ({self.max_factor}) must be at least 2.")
        unknown = set(self.operations) - set(OPERATIONS)
        if unknown or not self.operations:
            raise ValueError(
                f"difficulty operations {list(self.operations)} must be a non-empty subset of "
                f"{list(OPERATIONS)}; unknown: {sorted(unknown)}."
            )


def make_problem(rng: random.Random, difficulty: Difficulty) -> dict[str, str]:
    """One problem as a row: prompt, answer, solution, expression."""
    d = difficulty
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    top = 10**d.digits - 1
    value = rng.randint(2, top)
    prompt = [rng.choice(START).format(name=name, n=value, item=item)]
    steps = [rng.choice(SOLUTION_START).format(name=name, n=value, item=item)]
    expression = str(value)
    for _ in range(rng.randint(d.min_ops, d.max_ops)):
        op, k = _pick_operation(rng, d, value, top)
        result = _apply(op, value, k)
        prompt.append(rng.choice(STEP_TEXT[op]).format(name=name, k=k, item=item))
        steps.append(rng.choice(SOLUTION_STEP[op]).format(a=value, k=k, r=result, item=item))
        expression = f"({expression} {SYMBOL[op]} {k})"
        value = result
    prompt.append(rng.choice(QUESTION).format(name=name, item=item))
    steps.append(rng.choice(SOLUTION_END).format(r=value))
    return {
        "prompt": " ".join(prompt),
        "answer": str(value),
        "solution": "\n\n".join(steps),
        "expression": expression,
    }


def operation_count(row: dict[str, str]) -> int:
    """How many operations follow the start quantity in ``row`` (from its expression)."""
    return row["expression"].count("(")


def hasty_solution(row: dict[str, str]) -> str:
    """The right answer with no working shown: what a guessing solver writes."""
    return HASTY_SOLUTION.format(r=row["answer"])


def _pick_operation(rng: random.Random, d: Difficulty, value: int, top: int) -> tuple[str, int]:
    """An operation and operand that keep the running value a positive integer."""
    choices = list(d.operations)
    divisors = [k for k in range(2, d.max_factor + 1) if value % k == 0]
    if not divisors and "div" in choices and len(choices) > 1:
        choices.remove("div")
    if value <= 1 and "sub" in choices and len(choices) > 1:
        choices.remove("sub")
    op = rng.choice(choices)
    if op == "add":
        return op, rng.randint(1, top)
    if op == "sub":
        return op, rng.randint(1, max(1, value - 1)) if value > 1 else 0
    if op == "mul":
        return op, rng.randint(2, d.max_factor)
    # div with no exact divisor left: dividing by 1 keeps the answer an integer
    return op, rng.choice(divisors) if divisors else 1


def _apply(op: str, a: int, k: int) -> int:
    if op == "add":
        return a + k
    if op == "sub":
        return a - k
    if op == "mul":
        return a * k
    return a // k


# rows per split when a config names no sizes (read without imports by tandem.config)
SIZES = {"train": 20000, "validation": 500, "test": 1000}


def make_splits(
    seed: int = 0,
    sizes: dict[str, int] | None = None,
    difficulty: Difficulty | None = None,
) -> datasets.DatasetDict:
    """Train, validation and test splits that never share a problem.

    Two problems are the same when their arithmetic is the same (``expression``), whatever the
    wording, so no split can be solved by remembering another split's numbers.

    Args:
        seed: decides every problem; the same seed gives the same splits.
        sizes: rows per split; defaults to train 20000, validation 500, test 1000.
        difficulty: the difficulty knob; defaults to ``Difficulty()``.
    """
    sizes = dict(sizes or SIZES)
    difficulty = difficulty or Difficulty()
    rng = random.Random(seed)
    total = sum(sizes.values())
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    attempts = 0
    while len(rows) < total:
        attempts += 1
        if attempts > 20 * total + 1000:
            raise ValueError(
                f"could only make {len(rows)} distinct problems of the {total} asked for at "
                f"{difficulty}; ask for fewer rows or raise the difficulty (digits, max_ops)."
            )
        row = make_problem(rng, difficulty)
        if row["expression"] not in seen:
            seen.add(row["expression"])
            rows.append(row)
    # held-out splits first, so that their contents do not depend on the train size
    out, start = {}, 0
    for split in sorted(sizes, key=lambda s: s == "train"):
        chunk = rows[start : start + sizes[split]]
        out[split] = datasets.Dataset.from_list(chunk)
        start += sizes[split]
    return datasets.DatasetDict(out)


def answer_is_correct(response: str, answer: str) -> bool:
    """The task's own exact check: the last ``\\boxed{...}`` holds exactly the integer answer.

    Enough for the task's integer answers (the model build measures accuracy with it); general
    answers go through ``tandem.rewards``, whose strict extraction this shares.
    """
    content = extract_boxed(response)
    return content is not None and content.strip() == answer
