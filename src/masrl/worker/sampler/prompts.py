"""Prompt token ids: chat templates, tool specs, raw prompts, and exact continuation of a turn.

A multi-turn agent sends its whole conversation again on every request, its earlier completions
included as text. Re-tokenising that text need not give the ids the model sampled (a sampled
``"hel" + "lo"`` re-tokenises as ``"hello"``), and training on ids the model never produced is
training on something else. So the renderer remembers each call it rendered (a bounded cache):
when a call ``extends`` an earlier one, that is, its messages are the earlier call's messages, the
earlier completion and more, its prompt is the earlier prompt ids, the sampled completion ids as
they were, and then only the new text, tokenised. Where the template's text does not continue the
earlier turn exactly (a template that rewrites history, a completion cut by a stop string the
template would render otherwise), the whole conversation is tokenised afresh and counted.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from masrl.errors import ContextOverflow, PromptError
from masrl.messages import RAW_ROLE, GenCall

# no tokenizer packs more UTF-8 bytes than this into one token on average: a longer prompt cannot fit. Bytes,
# not characters: a byte-level tokenizer gives an emoji (4 bytes) up to 4 tokens, so 130k emoji (3-4x a
# context's tokens) passed a count of characters and were tokenised whole before they were refused
MAX_BYTES_PER_TOKEN = 32


@dataclass
class Turn:
    text: str  # the rendered prompt text
    prompt_ids: list[int]
    completion_ids: list[int]


def prompt_bytes(call: GenCall, stop_past: int) -> int:
    """The UTF-8 bytes of ``call``'s messages and tool specs, counted until past ``stop_past``."""
    total = 0
    for m in call.messages:
        total += len((m.get("content") or "").encode("utf-8", "surrogatepass"))
        if total > stop_past:
            return total
    for t in call.tools or []:
        total += len(json.dumps(t).encode("utf-8", "surrogatepass"))
        if total > stop_past:
            break
    return total


class PromptRenderer:
    def __init__(self, tokenizer, keep: int = 8192):
        self.tok = tokenizer
        self.turns: OrderedDict[str, Turn] = OrderedDict()
        self.pending: dict[str, str] = {}  # call id -> its prompt text, until its completion is known
        self.keep = keep
        self.stats = {"continued": 0, "retokenized": 0}
        self._special = frozenset(getattr(tokenizer, "all_special_ids", None) or [])

    def text(self, messages: list[dict], template_kwargs: dict | None, tools: list[dict] | None,
             generation_prompt: bool = True) -> str:
        """The template's text. With ``tools``: through the template's own ``tools=`` where it has
        one, else in masrl's tag format (``tools.calls``)."""
        kwargs = dict(template_kwargs or {})
        if tools or any(m.get("role") == "tool" for m in messages):
            from masrl.tools.calls import template_renders_tools, with_tools_in_text

            if template_renders_tools(self.tok):
                if tools:
                    kwargs["tools"] = tools
            else:
                messages = with_tools_in_text(messages, tools or [])
        return self.tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False, **kwargs)

    def prepare(self, calls: list[GenCall], limit: int) -> list[list[int] | PromptError]:
        """Each call's prompt ids (tokenised in one batch, the text kept in ``pending`` until the call's
        completion is known), or the ``PromptError`` that fails that call alone: too many characters to
        be worth tokenising (no tokenizer packs more than ``MAX_BYTES_PER_TOKEN`` bytes into a token), a render
        or tokeniser failure, a prompt of no tokens, or a prompt that with its ``max_new_tokens`` does not fit
        ``limit``."""
        out: list[list[int] | PromptError | None] = [None] * len(calls)
        todo = []
        for i, c in enumerate(calls):
            size = prompt_bytes(c, limit * MAX_BYTES_PER_TOKEN)
            if size > limit * MAX_BYTES_PER_TOKEN:
                out[i] = PromptError(f"the prompt has more than {limit * MAX_BYTES_PER_TOKEN:,} bytes, more than the "
                                     f"model's context of {limit:,} tokens holds (at most {MAX_BYTES_PER_TOKEN} bytes a "
                                     f"token); refused before tokenising")
            else:
                todo.append(i)
        rendered = self.render_many([(calls[i].messages, calls[i].template_kwargs, calls[i].tools, calls[i].extends)
                                     for i in todo])
        for i, r in zip(todo, rendered):
            c = calls[i]
            if isinstance(r, Exception):  # the call's own content (the template or tokenizer refused it)
                out[i] = PromptError(f"the prompt could not be rendered and tokenised: {type(r).__name__}: {r}")
                continue
            text, p = r
            if not p:  # a raw prompt whose every character the tokenizer drops ("\x16"): nothing to continue from
                out[i] = PromptError("the prompt is empty once tokenised (the tokenizer keeps none of its characters); "
                                     "give it some text")
                continue
            self.pending[c.call_id] = text
            fits = len(p) + c.sampling.max_new_tokens <= limit
            out[i] = p if fits else ContextOverflow(len(p), c.sampling.max_new_tokens, limit)
        return out

    def render(self, messages: list[dict], template_kwargs: dict | None = None, tools: list[dict] | None = None,
               extends: str | None = None) -> tuple[str, list[int]]:
        """``(text, prompt ids)``; ``extends``: the call whose conversation these messages continue."""
        out = self.render_many([(messages, template_kwargs, tools, extends)])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def render_many(self, prompts: list[tuple[list[dict], dict | None, list[dict] | None, str | None]]
                    ) -> list[tuple[str, list[int]] | Exception]:
        """``render`` for each ``(messages, template_kwargs, tools, extends)``, the new text of all of them
        tokenised in one call of the tokenizer (a fast tokenizer encodes a batch on its own threads, without
        the interpreter's lock that the engine's thread needs meanwhile). A prompt whose template or tokenizer
        fails gets its exception in its place; the others are unaffected."""
        heads: list[tuple[str, list[int], str] | Exception] = []
        for messages, template_kwargs, tools, extends in prompts:
            try:
                heads.append(self._head(messages, template_kwargs, tools, extends))
            except Exception as exc:  # this prompt's own content: the template refused it
                heads.append(exc)
        ids = iter(self._ids_many([h[2] for h in heads if not isinstance(h, Exception)]))
        out: list[tuple[str, list[int]] | Exception] = []
        for h in heads:
            new = h if isinstance(h, Exception) else next(ids)
            out.append(new if isinstance(new, Exception) else (h[0], h[1] + new))
        return out

    def _head(self, messages, template_kwargs, tools, extends) -> tuple[str, list[int], str]:
        """``(text, the ids it starts with, the rest of the text still to tokenise)``: a raw prompt and a
        fresh conversation start with no ids; a continued turn with the earlier prompt and sampled ids."""
        if len(messages) == 1 and messages[0].get("role") == RAW_ROLE:  # a raw prompt (no chat template)
            return messages[0]["content"], [], messages[0]["content"]
        text = self.text(messages, template_kwargs, tools)
        turn = self.turns.get(extends) if extends else None
        if turn is not None:
            cont = self._continue(turn, text)
            if cont is not None:
                self.stats["continued"] += 1
                return text, *cont
            self.stats["retokenized"] += 1
        return text, [], text

    def _continue(self, turn: Turn, text: str) -> tuple[list[int], str] | None:
        """The earlier prompt and sampled ids, and the new text after them; None where ``text`` does not
        begin with the earlier prompt and completion."""
        if not text.startswith(turn.text):
            return None
        head, rest = turn.prompt_ids + turn.completion_ids, text[len(turn.text):]
        covered = self.tok.decode(turn.completion_ids, skip_special_tokens=False)
        if rest.startswith(covered):
            return head, rest[len(covered):]
        if self._special.isdisjoint(turn.completion_ids):  # decoding without them would give the same text
            return None
        covered = self.tok.decode(turn.completion_ids, skip_special_tokens=True)
        return (head, rest[len(covered):]) if rest.startswith(covered) else None

    def remember(self, call_id: str, prompt_ids: list[int], completion_ids: list[int], text: str | None = None) -> None:
        """Keep a finished call's turn; its prompt text is the one ``render`` was given for it."""
        text = self.pending.pop(call_id) if text is None else text
        self.turns[call_id] = Turn(text, list(prompt_ids), list(completion_ids))
        while len(self.turns) > self.keep:
            self.turns.popitem(last=False)

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []

    def _ids_many(self, texts: list[str]) -> list[list[int] | Exception]:
        """Each text's ids, in one tokenizer call; if that call fails, text by text, so a text the
        tokenizer refuses fails alone."""
        todo = [t for t in texts if t]
        try:
            got = iter(self.tok(todo, add_special_tokens=False)["input_ids"] if todo else [])
            return [list(next(got)) if t else [] for t in texts]
        except Exception:
            out: list[list[int] | Exception] = []
            for t in texts:
                try:
                    out.append(self._ids(t))
                except Exception as exc:
                    out.append(exc)
            return out
