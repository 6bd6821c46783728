"""A conversation that continues an earlier call reuses that call's exact prompt and sampled ids."""

from masrl.models import load_tokenizer
from masrl.worker.prompts import PromptRenderer

TOK = load_tokenizer("smollm2-135m-instruct")
FIRST = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def _split_ids(text_pieces):
    """Ids of each piece tokenised alone: a split the model could sample but the tokenizer would not make."""
    return [i for piece in text_pieces for i in TOK(piece, add_special_tokens=False)["input_ids"]]


def test_a_continued_turn_keeps_the_sampled_ids_where_retokenising_would_not():
    r = PromptRenderer(TOK)
    text, prompt = r.render(FIRST)
    sampled = _split_ids(["hel", "lo", " wor", "ld"])
    completion = TOK.decode(sampled, skip_special_tokens=True)
    assert completion == "hello world" and TOK(completion, add_special_tokens=False)["input_ids"] != sampled
    r.remember("c1", prompt, sampled, text=text)
    more = FIRST + [{"role": "assistant", "content": completion}, {"role": "user", "content": "Again."}]
    _, ids = r.render(more, extends="c1")
    _, fresh = r.render(more)
    assert ids[: len(prompt) + len(sampled)] == prompt + sampled  # exactly what was sampled
    assert fresh != ids and TOK.decode(fresh) == TOK.decode(ids)  # same text, other ids
    assert r.stats == {"continued": 1, "retokenized": 0}


def test_a_completion_that_ended_with_the_end_of_turn_token_continues_after_it():
    r = PromptRenderer(TOK)
    text, prompt = r.render(FIRST)
    end = TOK.convert_tokens_to_ids("<|im_end|>")
    sampled = _split_ids(["hel", "lo"]) + [end]
    r.remember("c1", prompt, sampled, text=text)
    more = FIRST + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "Again."}]
    _, ids = r.render(more, extends="c1")
    head = len(prompt) + len(sampled)
    assert ids[:head] == prompt + sampled
    assert ids[head] != end  # the turn's end is not written twice: what follows is the next turn
    assert TOK.decode(ids) == TOK.decode(r.render(more)[1])


def test_a_rewritten_history_is_tokenised_afresh_and_counted():
    r = PromptRenderer(TOK)
    text, prompt = r.render(FIRST)
    r.remember("c1", prompt, _split_ids(["hel", "lo"]), text=text)
    edited = FIRST + [{"role": "assistant", "content": "HELLO"}, {"role": "user", "content": "Again."}]
    _, ids = r.render(edited, extends="c1")
    assert ids == r.render(edited)[1] and r.stats == {"continued": 0, "retokenized": 1}
