"""The fixed probe set of the dtype check (precision.py): queries and passages of varied length,
language and domain, shipped with the package so that a verdict means the same everywhere.
Each query has passages that answer it and passages near it that do not, so its top 10 among
them is a real ranking; `VERSION` is part of every cached verdict's key."""

from __future__ import annotations

VERSION = 1

QUERIES = [
    "how do I reset my password",
    "what causes the seasons on Earth",
    "symptoms of iron deficiency",
    "best way to store fresh basil",
    "when did the Berlin wall fall",
    "python sort a list of dictionaries by a key",
    "Wie hoch ist der Eiffelturm?",
    "¿Cuál es la capital de Australia?",
    "東京の人口は何人ですか",
    "机器学习和深度学习的区别",
    "как приготовить борщ",
    "interest rate effect on bond prices",
]

_PROSE = (
    "The history of the city begins with a small fishing village on the river bank. Over the "
    "centuries the market grew, merchants arrived from distant ports, and the town walls were "
    "extended twice. "
)

PASSAGES = [
    "To reset your password, open Settings, choose Security and follow the link we email you.",
    "Forgot your login? Use the 'Forgot password' link on the sign-in page to get a reset code.",
    "Our office is closed on public holidays; support tickets are answered the next working day.",
    "The seasons happen because Earth's axis is tilted about 23.4 degrees to its orbit.",
    "Summer comes when your hemisphere leans toward the Sun and receives more direct light.",
    "The distance between Earth and the Sun changes little during the year.",
    "Iron deficiency often causes fatigue, pale skin, shortness of breath and cold hands.",
    "Anaemia from low iron can make people tired and dizzy; a blood test confirms it.",
    "Vitamin C helps the body absorb iron from plant foods.",
    "Keep basil like cut flowers: stems in a glass of water at room temperature.",
    "Basil leaves turn black in the fridge; freeze chopped basil in olive oil instead.",
    "Rosemary and thyme are hardy herbs that survive cold winters outdoors.",
    "The Berlin Wall fell on 9 November 1989, when border crossings opened.",
    "Germany was reunified in October 1990, less than a year after the wall came down.",
    "The Great Wall of China stretches for thousands of kilometres.",
    "Use sorted(items, key=lambda d: d['name']) to sort a list of dicts by one key.",
    "list.sort(key=operator.itemgetter('age')) sorts the list in place by the 'age' field.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "Der Eiffelturm ist etwa 330 Meter hoch und steht in Paris.",
    "Die Zugspitze ist mit 2962 Metern der höchste Berg Deutschlands.",
    "La capital de Australia es Canberra, no Sídney.",
    "Sídney es la ciudad más grande de Australia y tiene una famosa ópera.",
    "東京都の人口は約1400万人で、日本で最も多い。",
    "大阪は日本で二番目に大きな都市圏です。",
    "深度学习是机器学习的一个分支，使用多层神经网络。",  # noqa: RUF001
    "机器学习让计算机能够从数据中学习规律。",
    "Борщ варят из свёклы, капусты, картофеля и мяса, подают со сметаной.",  # noqa: RUF001
    "Москва является столицей и крупнейшим городом России.",
    "When interest rates rise, existing bonds lose value because new bonds pay more.",
    "Bond prices and yields move in opposite directions.",
    "Stocks of utility companies are often sensitive to interest rates.",
    "The quick brown fox jumps over the lazy dog.",
    " ".join(["data"] * 120),
    _PROSE * 4,
    "A cat sat on the warm windowsill watching the rain.",
    "Football is the most popular sport in the world by number of fans.",
    "",
]
