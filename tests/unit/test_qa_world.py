import json

from masrl.data.qa_scoring import exact_match, normalize_answer, token_f1
from masrl.families.qa.world_gen import build_world, documents, questions, write_world
from masrl.tools.retrieval import LocalRetriever


def test_world_is_seeded_and_sized():
    a, b = build_world(300, seed=1), build_world(300, seed=1)
    assert documents(a) == documents(b) and questions(a, 50) == questions(b, 50)
    assert a.n_docs == 300 and documents(build_world(300, seed=2)) != documents(a)
    names = [e["name"] for e in a.people + a.cities + a.orgs]
    assert len(set(names)) == len(names)


def test_question_mix_and_unique_answers():
    w = build_world(500, seed=3)
    qs = questions(w, 300, seed=3)
    kinds = {q["type"] for q in qs}
    assert kinds == {"one_hop", "two_hop", "comparison"}
    assert len({q["question"] for q in qs}) == 300
    assert all(len(q["answers"]) == 1 and q["answers"][0] for q in qs)
    assert all(len(q["supporting"]) == (1 if q["type"] == "one_hop" else 2) for q in qs)


def test_answers_are_in_the_supporting_documents():
    w = build_world(300, seed=4)
    docs = {d["id"]: d["text"] for d in documents(w, seed=4)}
    for q in questions(w, 200, seed=4):
        if q["type"] != "comparison":
            assert q["answers"][0] in docs[q["supporting"][-1]]


def test_questions_are_answerable_from_retrieved_documents(tmp_path):
    corpus, qpath = write_world(tmp_path, 400, 200, seed=5)
    r = LocalRetriever(corpus)
    qs = [json.loads(x) for x in qpath.read_text().splitlines()]
    hits = 0
    for q in qs:
        first = r.retrieve([q["question"]], 5)[0]
        found = {d["id"] for d in first}
        text = " ".join(d["contents"] for d in first)
        if q["type"] == "two_hop":  # second hop: search for the bridge entity named in the first document
            assert q["bridge"] in text or q["supporting"][0] not in found
            second = r.retrieve([q["bridge"]], 3)[0]
            found |= {d["id"] for d in second}
            text += " ".join(d["contents"] for d in second)
        ok = set(q["supporting"]) <= found and (q["type"] == "comparison" or q["answers"][0] in text)
        hits += ok
    assert hits / len(qs) >= 0.9, hits


def test_large_world_generates_quickly():
    import time

    t0 = time.time()
    w = build_world(100_000, seed=0)
    docs = documents(w)
    assert len(docs) == 100_000 and time.time() - t0 < 60


def test_qa_scoring():
    assert normalize_answer("The  Vexora Labs!") == "vexora labs"
    assert exact_match("the vexora labs", ["Vexora Labs"]) == 1.0
    assert exact_match("Vexora", ["Vexora Labs", "Other"]) == 0.0
    assert token_f1("Vexora Labs Inc", ["Vexora Labs"]) == 0.8
    assert token_f1("nothing", ["Vexora Labs"]) == 0.0
    assert token_f1("x", ["y", "x"]) == 1.0
