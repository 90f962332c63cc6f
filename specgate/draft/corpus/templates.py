"""Seeded sentence templates: chat, instructions, maths word problems,
summaries of invented passages and multi-turn conversations. Every word list
is written for this project."""

from __future__ import annotations

import random

from specgate.draft.corpus.mixing import Maker, Row, distinct

SOURCE = "templates"

TOPICS = ["sleep", "running", "learning a language", "saving money", "houseplants", "bread baking",
          "public speaking", "time management", "cycling to work", "keeping a diary", "chess", "birdwatching",
          "cooking rice", "remote work", "moving house", "job interviews", "reading more books", "swimming",
          "camping", "drinking more water", "stretching", "taking notes", "composting", "photography",
          "meditation", "budgeting for a holiday", "painting with watercolours", "learning the guitar",
          "gardening on a balcony", "studying for exams", "making friends in a new city", "hiking",
          "writing emails", "cleaning the kitchen", "fixing a bicycle", "baking cookies", "yoga",
          "learning to code", "knitting", "volunteering", "raising a puppy", "reducing screen time",
          "packing for a trip", "growing tomatoes", "meal planning", "journaling", "negotiating a salary",
          "teaching a child to read", "sorting out old photos", "planning a birthday party"]
AUDIENCES = ["a ten-year-old", "a busy parent", "a retired teacher", "a university student", "a complete beginner",
             "a friend who is nervous about it", "my grandmother", "a new colleague"]
CHAT = ["Give me three tips for {t}.", "What are common mistakes people make with {t}?",
        "Explain {t} to {a} in a few sentences.", "Write a short, friendly paragraph encouraging {a} to try {t}.",
        "List five questions a beginner might ask about {t}, with short answers.",
        "What is a simple weekly plan for getting better at {t}?", "Write a haiku about {t}.",
        "What are the pros and cons of {t}?", "How do I get started with {t}? Keep it short.",
        "Suggest a first goal for someone new to {t}.", "Why do people enjoy {t}?",
        "Write a two-line motivational message about {t}.", "What equipment do I need for {t}?",
        "I have twenty minutes a day. How can I use them for {t}?"]
INSTRUCTIONS = ["Rewrite this sentence so it sounds more formal: \"{s}\"",
                "Rewrite this sentence so it sounds friendlier: \"{s}\"",
                "Correct the grammar of this sentence: \"{s}\"", "Make this sentence shorter: \"{s}\"",
                "Turn this sentence into a question: \"{s}\"", "Give two other ways to say: \"{s}\""]
SENTENCES = ["we was going to the shop but it were closed", "the meeting have been moved to thursday afternoon",
             "please send me the report by the end of the day", "I think the new plan are better then the old one",
             "the children plays in the garden every evening", "our team finished the project two weeks early",
             "can you tell me where is the train station", "the weather is nice so we should go for a walk",
             "he don't like coffee in the morning", "thanks for helping me move the sofa yesterday",
             "the price of the tickets have gone up again", "i will call you when i arrive at the hotel"]
PEOPLE = ["Maria", "Tom", "Aisha", "Lukas", "Priya", "Kenji", "Sofia", "Omar", "Elena", "David", "Nadia", "Pablo"]
ITEMS = [("apples", 0.4), ("notebooks", 2.5), ("pencils", 0.3), ("loaves of bread", 1.8), ("tickets", 12.0),
         ("plants", 4.5), ("books", 9.0), ("cups of coffee", 2.2)]
MATHS = ["{p} buys {n} {i} at {c:.2f} euros each. How much does {p} pay in total?",
         "{p} has {m} {i} and gives {n} of them away. How many are left?",
         "A box holds {n} {i}. How many boxes are needed for {m} {i}?",
         "{p} reads {n} pages a day. How many days does a {m}-page book take?",
         "A train travels at {n} km per hour for {h} hours. How far does it go?",
         "{p} saves {n} euros a week. How long until {p} has {m} euros?"]
PLACES = ["the town library", "a small bakery", "the city council", "a football club", "the village school",
          "a bicycle shop", "the regional hospital", "a community garden", "the river museum", "a start-up",
          "the local theatre", "a ferry company", "the county archive", "a youth orchestra"]
EVENTS = ["opened a new wing", "changed its opening hours", "raised money for repairs", "hired {n} new staff",
          "held a public meeting", "started a weekend programme", "won a regional award",
          "moved to a larger building", "cancelled a summer festival", "launched a mobile app"]
DETAILS = ["Visitors said the change was overdue.", "The work took {n} months.",
           "Some residents worried about the cost.", "A second phase is planned for next year.",
           "{p} led the project from the start.", "Attendance rose by {n} percent in the first month.",
           "The budget was approved after a long debate.", "Volunteers helped on weekends.",
           "Local newspapers covered the opening.", "Parking remains a problem, according to neighbours.",
           "A survey found that most users were satisfied.", "The decision will be reviewed in {n} weeks.",
           "Staff received extra training before the change.", "Critics called the plan rushed."]
SUMMARY = ["Summarise in one sentence:\n\n{x}", "Summarise the following text in three bullet points:\n\n{x}",
           "Write a short headline for this news item:\n\n{x}", "What is the main point of this text?\n\n{x}",
           "Who is mentioned in this text, and what did they do?\n\n{x}"]
FOLLOW_UPS = ["Can you make it shorter?", "Thanks! Can you give one more example?", "Why does that work?",
              "Can you put that as a numbered list?", "What should I avoid?", "How long will that take?"]


def chat(rng: random.Random) -> tuple[str, list[dict[str, str]]]:
    text = rng.choice(CHAT).format(t=rng.choice(TOPICS), a=rng.choice(AUDIENCES))
    return "chat/greedy", [{"role": "user", "content": text}]


def instruction(rng: random.Random) -> tuple[str, list[dict[str, str]]]:
    return "chat/greedy", [{"role": "user", "content": rng.choice(INSTRUCTIONS).format(s=rng.choice(SENTENCES))}]


def maths(rng: random.Random) -> tuple[str, list[dict[str, str]]]:
    item, cost = rng.choice(ITEMS)
    n = rng.randint(2, 12)
    text = rng.choice(MATHS).format(p=rng.choice(PEOPLE), n=n, m=n * rng.randint(2, 9), i=item,
                                    c=cost * rng.choice([1, 1.5, 2]), h=rng.randint(2, 6))
    return "math/greedy", [{"role": "user", "content": text}]


def summary(rng: random.Random) -> tuple[str, list[dict[str, str]]]:
    person, place = rng.choice(PEOPLE), rng.choice(PLACES)
    event = rng.choice(EVENTS).format(n=rng.randint(2, 12))
    details = " ".join(d.format(n=rng.randint(3, 40), p=person) for d in rng.sample(DETAILS, rng.randint(2, 5)))
    return "summarization/greedy", [{"role": "user", "content": rng.choice(SUMMARY).format(
        x=f"Last week {place} {event}. {details}")}]


def multi_turn(rng: random.Random) -> tuple[str, list[dict[str, str]]]:
    topic = rng.choice(TOPICS)
    return "chat/greedy", [
        {"role": "user", "content": f"Give me one tip for {topic}."},
        {"role": "assistant", "content": f"Start small: spend ten minutes a day on {topic} and keep at it."},
        {"role": "user", "content": rng.choice(FOLLOW_UPS)}]


KINDS: tuple[tuple[Maker, int], ...] = (
    (chat, 40), (instruction, 12), (maths, 18), (summary, 20), (multi_turn, 10))


def make(rng: random.Random, count: int) -> list[Row]:
    return distinct(rng, count, KINDS, SOURCE)
