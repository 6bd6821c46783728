"""A conversation that continues an earlier call reuses that call's exact prompt and sampled ids."""

from masrl.messages import RAW_ROLE
from masrl.models import load_tokenizer
from masrl.worker.sampler.prompts import PromptRenderer

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


def test_rendering_many_at_once_gives_each_prompt_the_ids_rendering_it_alone_gives():
    r = PromptRenderer(TOK)
    text, prompt = r.render(FIRST)
    sampled = _split_ids(["hel", "lo"])
    r.remember("c1", prompt, sampled, text=text)
    more = FIRST + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "Again."}]
    raw = [{"role": RAW_ROLE, "content": "Q: 2+2?\nA:"}]
    out = r.render_many([(FIRST, None, None, None), (more, None, None, "c1"), (raw, None, None, None),
                         ([{"role": RAW_ROLE, "content": ""}], None, None, None)])
    assert out[0] == r.render(FIRST)
    assert out[1][1][: len(prompt) + len(sampled)] == prompt + sampled  # the continued turn, as sampled
    assert out[1] == r.render(more, extends="c1")
    assert out[2] == ("Q: 2+2?\nA:", TOK("Q: 2+2?\nA:", add_special_tokens=False)["input_ids"])
    assert out[3] == ("", [])
    assert r.stats["continued"] == 2


def test_a_template_that_fails_for_one_prompt_fails_that_prompt_alone():
    class Picky:  # the real tokenizer, with a template that refuses one word
        def __getattr__(self, name):
            return getattr(TOK, name)

        def __call__(self, *a, **k):
            return TOK(*a, **k)

        def apply_chat_template(self, messages, **kw):
            if any("forbidden" in m["content"] for m in messages):
                raise ValueError("the template refuses this conversation")
            return TOK.apply_chat_template(messages, **kw)

    r = PromptRenderer(Picky())
    ok = [{"role": "user", "content": "fine"}]
    out = r.render_many([(ok, None, None, None), ([{"role": "user", "content": "forbidden"}], None, None, None),
                         (ok, None, None, None)])
    assert isinstance(out[1], ValueError) and "refuses" in str(out[1])
    assert out[0] == out[2] == PromptRenderer(TOK).render(ok)


def test_prepare_fails_only_the_calls_that_cannot_run_beside_good_ones():
    from masrl.config import SamplingParams
    from masrl.errors import ContextOverflow, PromptError
    from masrl.messages import GenCall
    from masrl.worker.sampler.prompts import MAX_BYTES_PER_TOKEN

    r = PromptRenderer(TOK)
    limit = 64

    def call(i, content, new=8):
        return GenCall(f"c{i}", "p", [{"role": "user", "content": content}], SamplingParams(max_new_tokens=new))

    emoji = "\U0001F642" * (limit * MAX_BYTES_PER_TOKEN // 4 + 1)  # fewer characters than the cap, 4 bytes each
    calls = [call(0, "Hi."), call(1, "x" * (limit * MAX_BYTES_PER_TOKEN + 1)), call(2, "word " * 80),
             call(3, "Hi.", new=limit), call(4, "Bye."), call(5, emoji)]
    out = r.prepare(calls, limit)
    assert out[0] == r.render(calls[0].messages)[1] and out[4] == r.render(calls[4].messages)[1]
    assert isinstance(out[1], PromptError) and "refused before tokenising" in str(out[1])
    assert isinstance(out[5], PromptError) and "refused before tokenising" in str(out[5])  # counted in bytes
    assert isinstance(out[2], ContextOverflow) and isinstance(out[3], ContextOverflow)  # too long; no room to answer
    assert set(r.pending) == {"c0", "c2", "c3", "c4"}  # rendered text kept for every call it tokenised
