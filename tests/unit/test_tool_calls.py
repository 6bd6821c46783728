"""Tool calls the model writes: parsing, and rendering through the chat template's `tools=` or the tag format."""

import copy

from masrl.models import load_tokenizer
from masrl.tools.base import tool
from masrl.tools.calls import parse_tool_calls, template_renders_tools, with_tools_in_text
from masrl.worker.sampler.prompts import PromptRenderer


@tool
def search(query: str, topk: int = 3) -> list:
    """Search the documents."""
    return []


def test_parse_tool_calls_tag_bare_json_and_mistakes():
    got = parse_tool_calls('ok <tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>'
                           '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"b\\"}"}</tool_call>')
    assert got.calls == [("search", {"query": "a"}), ("search", {"query": "b"})] and got.text == "ok"
    assert parse_tool_calls('{"name": "search", "parameters": {"query": "c"}}').calls == [("search", {"query": "c"})]
    assert parse_tool_calls('{"answer": 3}').calls == []  # JSON that is not a call is just text
    unclosed = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"query": "d"}}')
    assert unclosed.calls == [("search", {"query": "d"})]  # a stop string may eat the closing tag
    bad = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call><tool_call>nope</tool_call>')
    assert bad.calls == [] and len(bad.errors) == 2 and "needs a 'name'" in bad.errors[0]


MESSAGES = [{"role": "system", "content": "You search."}, {"role": "user", "content": "Who?"},
            {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'},
            {"role": "tool", "content": "[1] X: a document"}]


def _render(tok, messages, tools):
    _, ids = PromptRenderer(tok).render(messages, {}, tools)  # what PolicyWorker.render tokenises
    return tok.decode(ids)


def test_a_template_without_tools_gets_the_tag_format():
    tok = load_tokenizer("smollm2-135m-instruct")
    assert not template_renders_tools(tok)
    text = _render(tok, copy.deepcopy(MESSAGES), [search.spec()])
    assert '"name": "search"' in text and "<tool_call>{\"name\": NAME" in text  # described in the system message
    assert "<tool_response>[1] X: a document</tool_response>" in text and "<|im_start|>user\n<tool_response>" in text
    assert with_tools_in_text(MESSAGES, [])[3]["role"] == "user" and MESSAGES[3]["role"] == "tool"  # not mutated


NATIVE = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}:{{ t.function.description }};{% endfor %}"
          "</tools>{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_template_with_tools_renders_them_itself():
    tok = load_tokenizer("smollm2-135m-instruct")
    tok.chat_template = NATIVE  # the shape of Qwen's and Llama 3.1's templates: a `tools` variable
    assert template_renders_tools(tok)
    text = _render(tok, copy.deepcopy(MESSAGES), [search.spec()])
    assert text.startswith("<tools>search:Search the documents.;</tools>")
    assert "<tool>[1] X: a document</tool>" in text and "<tool_response>" not in text
    assert search.spec()["function"]["parameters"]["required"] == ["query"]
