"""The math roles' prompts and parsers, shared by the math team, the solver, the checked team and debate.

Prompts: a short system prompt plus worked example turns (the solver's: one of each kind of problem).

A 135M model follows a tag format only when shown one: with an instruction alone, or with an
example inside the system prompt, SmolLM2-135M-Instruct gave 0/32 outputs in the asked format;
with two worked question/answer turns before the question it gave 21/32. So each agent gets
two example turns, kept short because every prompt token is paid again in the update.
"""

from __future__ import annotations

from masrl.parsing import ParseResult, TagSpec, is_number, nonempty, one_of, parse_tags

SOLVER_SYSTEM = (
    "You solve math word problems. Write the calculation in <solution></solution> "
    "and the final number in <answer></answer>."
)
# one worked example of each kind of problem (data/arithmetic.py): a sum, a difference, a share (levels 1-3)
# and a two-step problem (level 4); with the sum and difference alone no arm ever solved a level-4 problem
SOLVER_EXAMPLES = [
    ("Ana has 3 pens and buys 4 more. How many pens does Ana have now?", "<solution>3 + 4 = 7</solution><answer>7</answer>"),
    ("Omar had 15 cards and gave away 6. How many cards are left?", "<solution>15 - 6 = 9</solution><answer>9</answer>"),
    ("Lena shares 12 stamps equally among 3 friends. How many stamps does each friend get?",
     "<solution>12 / 3 = 4</solution><answer>4</answer>"),
    ("Kofi buys 2 packs of shells with 5 in each pack, and already had 3. How many shells does Kofi have now?",
     "<solution>2 * 5 + 3 = 13</solution><answer>13</answer>"),
]

# the checked team's checker (and ``math_solver``'s ``style: expression``): words to one expression, the
# calculator does the arithmetic; the same four kinds of problem as the solver's examples
CHECKER_SYSTEM = ("You turn a math word problem into one arithmetic expression that a calculator computes. "
                  "Write only the expression in <expr></expr>.")
CHECKER_EXAMPLES = [
    ("Ana has 3 pens and buys 4 more. How many pens does Ana have now?", "<expr>3 + 4</expr>"),
    ("Omar had 15 cards and gave away 6. How many cards are left?", "<expr>15 - 6</expr>"),
    ("Lena shares 12 stamps equally among 3 friends. How many stamps does each friend get?", "<expr>12 / 3</expr>"),
    ("Kofi buys 2 packs of shells with 5 in each pack, and already had 3. How many shells does Kofi have now?",
     "<expr>2 * 5 + 3</expr>"),
]

VERIFIER_SYSTEM = (
    "You check a solution to a math word problem. Reply with <status>correct</status> or "
    "<status>incorrect</status>, then one short sentence in <feedback></feedback>."
)
VERIFIER_EXAMPLES = [
    ("Question: Ana has 3 pens and buys 4 more. How many pens does Ana have now?\nSolution: 3 + 4 = 8",
     "<status>incorrect</status><feedback>3 + 4 is 7, not 8.</feedback>"),
    ("Question: Omar had 15 cards and gave away 6. How many cards are left?\nSolution: 15 - 6 = 9",
     "<status>correct</status><feedback>15 - 6 is 9.</feedback>"),
]

REFINER_SYSTEM = (
    "You fix a solution to a math word problem using a check of it. "
    "Write the corrected calculation in <solution></solution>."
)
REFINER_EXAMPLES = [
    ("Question: Ana has 3 pens and buys 4 more. How many pens does Ana have now?\nSolution: 3 + 4 = 8\n"
     "Check: incorrect. 3 + 4 is 7, not 8.", "<solution>3 + 4 = 7</solution>"),
    ("Question: Omar had 15 cards and gave away 6. How many cards are left?\nSolution: 15 - 6 = 9\n"
     "Check: correct. 15 - 6 is 9.", "<solution>15 - 6 = 9</solution>"),
]

FINALIZER_SYSTEM = "You give the final answer to a math word problem as one number in <answer></answer>."
FINALIZER_EXAMPLES = [
    ("Question: Ana has 3 pens and buys 4 more. How many pens does Ana have now?\nSolution: 3 + 4 = 7", "<answer>7</answer>"),
    ("Question: Omar had 15 cards and gave away 6. How many cards are left?\nSolution: 15 - 6 = 9", "<answer>9</answer>"),
]


SOLVER_TAGS = [TagSpec("solution"), TagSpec("answer", is_number)]
VERIFIER_TAGS = [TagSpec("status", one_of("correct", "incorrect", "uncertain")), TagSpec("feedback")]
REFINER_TAGS = [TagSpec("solution")]
FINALIZER_TAGS = [TagSpec("answer", is_number)]


def parse_solver(text: str):
    return parse_tags(text, SOLVER_TAGS)


def parse_verifier(text: str):
    return parse_tags(text, VERIFIER_TAGS)


def parse_refiner(text: str):
    return parse_tags(text, REFINER_TAGS)


def parse_finalizer(text: str):
    return parse_tags(text, FINALIZER_TAGS)


def parse_checker(text: str) -> ParseResult:
    """The checker's (or an expression-style solver's) ``<expr>arithmetic</expr>``."""
    return parse_tags(text, [TagSpec("expr", nonempty)])
