from masrl.families.math.roles import parse_finalizer, parse_solver, parse_verifier
from masrl.parsing import TagSpec, is_number, one_of, parse_tags

SOLVER = [TagSpec("solution"), TagSpec("answer", is_number)]


def test_perfect_output_is_ok():
    r = parse_tags("<solution>3 + 4 = 7</solution><answer>7</answer>", SOLVER)
    assert r.ok and r.score == 1.0
    assert r.fields == {"solution": "3 + 4 = 7", "answer": "7"}


def test_partial_credit_orders_outputs():
    scores = [
        parse_tags(t, SOLVER).score
        for t in [
            "the answer is 7",  # nothing
            "<answer>7</answer>",  # one tag
            "<solution>3+4</solution><answer>seven</answer>",  # answer not a number
            "<solution>3+4=7</solution><answer>7</answer> Hope this helps!",  # trailing text
            "<solution>3+4=7</solution><answer>7</answer>",
        ]
    ]
    assert scores == sorted(scores)
    assert scores[0] == 0.0 and scores[-1] == 1.0
    assert 0.0 < scores[1] < scores[2] < 1.0 and scores[3] < 1.0


def test_out_of_order_and_duplicates_are_not_ok():
    assert not parse_tags("<answer>7</answer><solution>x</solution>", SOLVER).ok
    assert not parse_tags("<solution>a</solution><solution>b</solution><answer>7</answer>", SOLVER).ok


def test_unclosed_tag_still_yields_content_leniently():
    r = parse_tags("<solution>3+4=7</solution><answer>7", SOLVER)
    assert not r.ok and r.fields["answer"] == "7"
    assert r.score >= 0.5


def test_validators():
    assert is_number("42") and is_number(" -3.5 ") and is_number("1,000") and is_number("$12")
    assert not is_number("seven") and not is_number("4 apples")
    assert one_of("correct", "incorrect")(" Correct ")
    assert not one_of("correct", "incorrect")("maybe")


def test_agent_parsers_never_raise_on_garbage():
    for text in ["", "<<<>>>", "</answer><answer>", "\x00\x01", "<status>" * 50]:
        for parse in (parse_solver, parse_verifier, parse_finalizer):
            r = parse(text)
            assert 0.0 <= r.score <= 1.0 and not r.ok


def test_verifier_status_values():
    assert parse_verifier("<status>incorrect</status><feedback>3+4 is 7.</feedback>").ok
    r = parse_verifier("<status>probably</status><feedback>x</feedback>")
    assert not r.ok and r.fields["status"] == "probably"
