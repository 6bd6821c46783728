"""A seeded fictional world for multi-hop QA: people, cities and organisations with invented names.

Each entity has one document (its facts plus distractor sentences). Questions:
  one-hop      "In what year was Dalen Morvik born?"                      (one document)
  two-hop      "In what year was the founder of Vexora Labs born?"        (organisation -> person)
  comparison   "Who was born first, Dalen Morvik or Tiru Oskal?"          (two documents)
Names and facts are drawn at random, so no answer can be known without reading the documents.
Every fact has one value, so every question has one answer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

SYLLABLES = ["ka", "lo", "mi", "ra", "ten", "vo", "sa", "dri", "mel", "or", "ques", "ban", "li", "tor", "ne", "sul",
             "fa", "gri", "ho", "ix", "ja", "ke", "mun", "pa", "zel", "wy", "thar", "ul", "ve", "bro", "cas", "den",
             "el", "fin", "gal", "hu", "in", "jor", "kel", "lun"]
ORG_KINDS = ["Labs", "Works", "Guild", "Trading", "Institute", "Foundry", "Collective", "Systems"]
INDUSTRIES = ["shipbuilding", "textiles", "astronomy", "glassmaking", "publishing", "mining", "botany", "clockmaking"]
OCCUPATIONS = ["engineer", "painter", "cartographer", "surgeon", "composer", "chemist", "architect", "linguist"]
COUNTRIES = ["Valmora", "Ostrend", "Keshar", "Lirien", "Damascar", "Pellune", "Tovaria", "Quenmark"]
HOBBIES = ["sailing", "chess", "beekeeping", "archery", "pottery", "birdwatching", "fencing", "gardening"]
COLORS = ["amber", "teal", "crimson", "ivory", "olive", "indigo", "saffron", "slate"]


@dataclass
class World:
    people: list[dict] = field(default_factory=list)
    cities: list[dict] = field(default_factory=list)
    orgs: list[dict] = field(default_factory=list)

    @property
    def n_docs(self) -> int:
        return len(self.people) + len(self.cities) + len(self.orgs)


class _Names:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, lo: int = 2, hi: int = 3) -> str:
        return "".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.randint(lo, hi))).capitalize()

    def unique(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("ran out of distinct names; the world is too large for the syllable set")


def build_world(n_docs: int, *, seed: int = 0) -> World:
    """About ``n_docs`` entities: 60% people, 20% cities, 20% organisations (at least 4 of each)."""
    if n_docs < 12:
        raise ValueError("a QA world needs at least 12 documents")
    rng = random.Random(seed)
    names = _Names(rng)
    n_cities = max(4, n_docs // 5)
    n_orgs = max(4, n_docs // 5)
    n_people = max(4, n_docs - n_cities - n_orgs)
    w = World()
    for i in range(n_cities):
        w.cities.append({"id": f"city-{i}", "name": names.unique(lambda: names.word(2, 3)),
                         "country": rng.choice(COUNTRIES), "founded": rng.randint(800, 1900),
                         "population": rng.randint(2, 900) * 1000})
    for i in range(n_people):
        w.people.append({"id": f"person-{i}", "name": names.unique(lambda: f"{names.word(2, 2)} {names.word(2, 3)}"),
                         "born": rng.randint(1900, 2000), "birthplace": rng.randrange(n_cities),
                         "occupation": rng.choice(OCCUPATIONS), "hobby": rng.choice(HOBBIES), "color": rng.choice(COLORS)})
    for i in range(n_orgs):
        w.orgs.append({"id": f"org-{i}", "name": names.unique(lambda: f"{names.word(2, 3)} {rng.choice(ORG_KINDS)}"),
                       "founded": rng.randint(1800, 2020), "hq": rng.randrange(n_cities),
                       "founder": rng.randrange(n_people), "industry": rng.choice(INDUSTRIES)})
    for p in w.people:
        p["employer"] = rng.randrange(n_orgs)
    for c in w.cities:
        c["mayor"] = rng.randrange(n_people)
    return w


def documents(w: World, *, seed: int = 0) -> list[dict]:
    rng = random.Random(seed + 1)
    docs = []
    for p in w.people:
        city, org = w.cities[p["birthplace"]], w.orgs[p["employer"]]
        other = w.people[rng.randrange(len(w.people))]
        facts = [f"{p['name']} was born in {p['born']} in {city['name']}.",
                 f"{p['name']} works for {org['name']} as {_article(p['occupation'])}."]
        distract = [f"{p['name']} enjoys {p['hobby']} on weekends.", f"{p['name']}'s favourite colour is {p['color']}.",
                    f"{p['name']} once shared a train compartment with {other['name']}.",
                    f"Friends describe {p['name']} as patient and curious."]
        docs.append(_doc(p, facts, distract, rng))
    for c in w.cities:
        mayor = w.people[c["mayor"]]
        facts = [f"{c['name']} is a city in {c['country']}, founded in {c['founded']}.",
                 f"The mayor of {c['name']} is {mayor['name']}.", f"{c['name']} has about {c['population']} inhabitants."]
        distract = [f"{c['name']} is known for its {rng.choice(COLORS)} rooftops.",
                    f"A market is held in {c['name']} every {rng.choice(['Monday', 'Thursday', 'Saturday'])}."]
        docs.append(_doc(c, facts, distract, rng))
    for o in w.orgs:
        founder, hq = w.people[o["founder"]], w.cities[o["hq"]]
        facts = [f"{o['name']} is a {o['industry']} company founded in {o['founded']} by {founder['name']}.",
                 f"{o['name']} has its headquarters in {hq['name']}."]
        distract = [f"{o['name']} sponsors a local {rng.choice(HOBBIES)} club.",
                    f"The logo of {o['name']} is {rng.choice(COLORS)}."]
        docs.append(_doc(o, facts, distract, rng))
    return docs


def _doc(entity: dict, facts: list[str], distract: list[str], rng: random.Random) -> dict:
    sentences = facts + distract
    rng.shuffle(sentences)
    return {"id": entity["id"], "title": entity["name"], "text": " ".join(sentences)}


def questions(w: World, n: int, *, seed: int = 0, mix: tuple[float, float, float] = (0.4, 0.4, 0.2)) -> list[dict]:
    """``n`` questions: one-hop, two-hop and comparison in proportion ``mix``."""
    rng = random.Random(seed + 2)
    out: list[dict] = []
    seen: set[str] = set()
    kinds = ["one_hop", "two_hop", "comparison"]
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 100:
            break
        kind = rng.choices(kinds, weights=mix)[0]
        q = {"one_hop": _one_hop, "two_hop": _two_hop, "comparison": _comparison}[kind](w, rng)
        if q is None or q["question"] in seen:
            continue
        seen.add(q["question"])
        q["id"] = f"q-{len(out)}"
        q["type"] = kind
        out.append(q)
    return out


def _one_hop(w: World, rng: random.Random) -> dict:
    choice = rng.randrange(4)
    if choice == 0:
        p = rng.choice(w.people)
        return {"question": f"In what year was {p['name']} born?", "answers": [str(p["born"])], "supporting": [p["id"]],
                "kind": "born"}
    if choice == 1:
        p = rng.choice(w.people)
        return {"question": f"Which organisation does {p['name']} work for?", "answers": [w.orgs[p["employer"]]["name"]],
                "supporting": [p["id"]], "kind": "employer"}
    if choice == 2:
        o = rng.choice(w.orgs)
        return {"question": f"In which city does {o['name']} have its headquarters?", "answers": [w.cities[o["hq"]]["name"]],
                "supporting": [o["id"]], "kind": "headquarters"}
    c = rng.choice(w.cities)
    return {"question": f"Who is the mayor of {c['name']}?", "answers": [w.people[c["mayor"]]["name"]], "supporting": [c["id"]],
            "kind": "mayor"}


def _two_hop(w: World, rng: random.Random) -> dict:
    choice = rng.randrange(3)
    if choice == 0:
        o = rng.choice(w.orgs)
        f = w.people[o["founder"]]
        return {"question": f"In what year was the founder of {o['name']} born?", "answers": [str(f["born"])],
                "supporting": [o["id"], f["id"]], "bridge": f["name"], "kind": "founder_born"}
    if choice == 1:
        p = rng.choice(w.people)
        org = w.orgs[p["employer"]]
        return {"question": f"In which city is the employer of {p['name']} headquartered?",
                "answers": [w.cities[org["hq"]]["name"]], "supporting": [p["id"], org["id"]], "bridge": org["name"],
                "kind": "employer_headquarters"}
    p = rng.choice(w.people)
    city = w.cities[p["birthplace"]]
    return {"question": f"Who is the mayor of the city where {p['name']} was born?",
            "answers": [w.people[city["mayor"]]["name"]], "supporting": [p["id"], city["id"]], "bridge": city["name"],
            "kind": "birthplace_mayor"}


def _comparison(w: World, rng: random.Random) -> dict | None:
    if rng.random() < 0.5:
        a, b = rng.sample(w.people, 2)
        if a["born"] == b["born"]:
            return None
        first = a if a["born"] < b["born"] else b
        return {"question": f"Who was born first, {a['name']} or {b['name']}?", "answers": [first["name"]],
                "supporting": [a["id"], b["id"]], "kind": "born_first"}
    a, b = rng.sample(w.orgs, 2)
    if a["founded"] == b["founded"]:
        return None
    first = a if a["founded"] < b["founded"] else b
    return {"question": f"Which was founded earlier, {a['name']} or {b['name']}?", "answers": [first["name"]],
            "supporting": [a["id"], b["id"]], "kind": "founded_first"}


def reading_context(docs: list[dict], supporting: list[str], n: int, rng: random.Random) -> list[str]:
    """``n`` passages (``Title: text``) for reading a question without search: its supporting
    documents and distractors of the same kinds (other people for a question about a person), in
    a random order. Every person's document states a birth year and an employer, so the reader has
    to find the right name, not the right kind of fact."""
    by_id = {d["id"]: d for d in docs}
    kinds = {s.split("-")[0] for s in supporting}
    pool = [d for d in docs if d["id"].split("-")[0] in kinds and d["id"] not in supporting]
    chosen = [by_id[s] for s in supporting if s in by_id]
    chosen += rng.sample(pool, min(len(pool), max(0, n - len(chosen))))
    rng.shuffle(chosen)
    return [f"{d['title']}: {d['text']}" for d in chosen]


def write_world(out_dir: str | Path, n_docs: int, n_questions: int, *, seed: int = 0) -> tuple[Path, Path]:
    """Write ``corpus.jsonl`` and ``questions.jsonl`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = build_world(n_docs, seed=seed)
    corpus, qs = out / "corpus.jsonl", out / "questions.jsonl"
    with corpus.open("w") as f:
        for d in documents(w, seed=seed):
            f.write(json.dumps(d) + "\n")
    with qs.open("w") as f:
        for q in questions(w, n_questions, seed=seed):
            f.write(json.dumps(q) + "\n")
    return corpus, qs


def _article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun
