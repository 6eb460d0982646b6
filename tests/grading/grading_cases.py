r"""Hand-picked grading cases: (prediction, gold, expected, symmetric).

`prediction` is what `extract_answer` returns from a model's answer block; `gold` is a dataset's clean
gold answer. Sources:
- `MODEL_STYLE_CASES`: hand-written in the answer spellings instruct models (Qwen2.5, Llama-3) use
  for GSM8K and MATH, paired with real gold answers of those datasets (GSM8K golds such as 18 and
  1,200; MATH golds such as "\left( 3, \frac{\pi}{2} \right)", "10,\!080", "\text{(C)}",
  "137 \frac{1}{2}").
- `SMOLLM2_CASES`: text copied verbatim from SmolLM2-135M-Instruct samples (temperature 1.0, the
  paper's system prompt plus one worked example, 96-160 new tokens) on synthetic, MATH-500 and GSM8K
  test questions.

`symmetric`: the verdict must also hold with prediction and gold swapped (maj@k compares two predictions).
It is False only where a rule is one-sided on purpose: an unevaluated arithmetic expression never
matches a numeric gold ("37 + 12" is not 49), but as a gold it can be matched by its value.

This module also holds `time_grading`, run in worker processes by the tests (it must be importable).
"""

T, F = True, False

MODEL_STYLE_CASES = [
    # --- GSM8K: integers written the way models write them ---------------------------------------
    ("18", "18", T, T),
    ("$18", "18", T, T),
    (r"\$18", "18", T, T),
    ("$18$", "18", T, T),
    (r"\(18\)", "18", T, T),
    (r"\boxed{18}", "18", T, T),
    (r"\boxed{\$18}", "18", T, T),
    ("18.", "18", T, T),
    ("18.0", "18", T, T),
    ("$18.00", "18", T, T),
    ("18 dollars", "18", T, T),
    (r"\text{18 dollars}", "18", T, T),
    (r"18 \text{ dollars}", "18", T, T),
    ("18 eggs per day", "18", T, T),
    ("The answer is 18", "18", T, T),
    ("Answer: 18", "18", T, T),
    ("x = 18", "18", T, T),
    ("9 * 2 = 18", "18", T, T),
    (r"16 - 3 - 4 = 9 \text{ eggs}", "9", T, T),
    ("1,000", "1000", T, T),
    ("1,000,000", "1000000", T, T),
    ("109,200,000", "109200000", T, T),
    (r"1{,}000", "1000", T, T),
    ("025", "25", T, T),
    ("0025.0", "25", T, T),
    ("-3", "-3", T, T),
    ("−3", "-3", T, T),  # unicode minus sign
    ("+5", "5", T, T),
    ("20%", "20", T, T),
    (r"20\%", "20", T, T),
    (r"5 \text{ cm}^2", "5", T, T),
    ("60 km/h", "60", T, T),
    ("3", "-3", F, T),
    ("17", "18", F, T),
    ("180", "18", F, T),
    ("1.8", "18", F, T),
    ("18.5", "18", F, T),
    ("1,001", "1000", F, T),
    ("0.2", "20", F, T),
    ("5 or 6", "5", F, T),
    ("5, 6", "5", F, T),
    ("56", "5", F, T),
    ("five", "5", F, T),
    ("I don't know", "5", F, T),
    ("", "5", F, T),
    (r"\boxed{}", "5", F, T),
    ("<reasoning>", "5", F, T),
    # A sentence against a number: its last number decides (lm-eval's flexible GSM8K extraction).
    ("Janet makes $18 every day.", "18", T, T),
    ("The total is 1,200 dollars", "1200", T, T),
    ("She needs 1/2 cup of flour", "0.5", T, T),
    ("He has 18 apples and 3 pears", "18", F, T),
    ("What is 24 - 12", "12", F, F),  # the question copied, with words around it
    # An unevaluated expression is not an answer to a numeric question (the synthetic task's hack).
    ("37 + 12", "49", F, F),
    ("16 - 3 - 4", "9", F, F),
    (r"9 \times 2", "18", F, F),
    (r"\frac{36}{2}", "18", T, T),  # a fraction is a number, not an expression
    # --- fractions and decimals ---------------------------------------------------------------------
    (r"\frac{1}{2}", "0.5", T, T),
    (r"\dfrac{1}{2}", "0.5", T, T),
    (r"\tfrac12", "1/2", T, T),
    ("1/2", "0.5", T, T),
    (r"\frac{3}{4}", "0.75", T, T),
    ("3/4", r"\frac34", T, T),
    (r"-\frac{1}{2}", "-0.5", T, T),
    (r"\frac{-1}{2}", "-0.5", T, T),
    (r"\frac{2}{4}", r"\frac{1}{2}", T, T),
    ("2.5", r"\frac{5}{2}", T, T),
    ("0.333333", r"\frac{1}{3}", T, T),  # math-verify's rule: decimals agree to 6 places
    ("0.3333", r"\frac{1}{3}", F, T),
    ("0.33", r"\frac13", F, T),
    ("0.5", r"\frac{1}{3}", F, T),
    ("137.5", r"137 \frac{1}{2}", T, T),  # MATH writes mixed numbers
    ("275/2", r"137 \frac{1}{2}", T, T),
    ("6.2", r"6\frac15", T, T),
    ("68.5", r"137 \frac{1}{2}", F, T),
    (r"\frac{7}{2}", "3.5", T, T),
    ("7/3", "2.33", F, T),
    # --- MATH: LaTeX answers ------------------------------------------------------------------------
    (r"\left( 3, \frac{\pi}{2} \right)", r"\left( 3, \frac{\pi}{2} \right)", T, T),
    (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", T, T),
    (r"(3, \pi/2)", r"\left( 3, \frac{\pi}{2} \right)", T, T),
    (r"(3, \pi)", r"\left( 3, \frac{\pi}{2} \right)", F, T),
    ("(2, 3)", "(3, 2)", F, T),
    (r"\frac{\sqrt{2}}{2}", r"\frac{\sqrt2}{2}", T, T),
    (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", T, T),
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", T, T),
    (r"2\sqrt{3}", r"\sqrt{12}", T, T),
    (r"3\sqrt{5}", r"3 \sqrt{5}", T, T),
    (r"11\sqrt2", r"11\sqrt{2}", T, T),
    (r"2\sqrt{5}", r"3\sqrt{5}", F, T),
    (r"\sqrt{4}", "2", T, T),
    (r"2^{10}", "1024", T, T),
    (r"2^{2005}", r"2^{2005}", T, T),
    (r"2^{2006}", r"2^{2005}", F, T),
    (r"3\pi", r"3 \pi", T, T),
    (r"288\pi", r"288 \pi", T, T),
    ("9.42", r"3\pi", F, T),
    (r"\pi", r"\pi", T, T),
    ("x^2 + 2x + 1", "(x+1)^2", T, T),
    ("x^2+1", "x^2-1", F, T),
    ("x^5 - x^4 + x^3 - x^2 + x - 1", "x^5-x^4+x^3-x^2+x-1", T, T),
    ("p - q", "p-q", T, T),
    ("q - p", "p-q", F, T),
    ("6 - 5i", "6-5i", T, T),
    ("6+5i", "6-5i", F, T),
    (r"1 \pm \sqrt{19}", r"1\pm\sqrt{19}", T, T),
    ("[0, \\infty)", "[0,\\infty)", T, T),
    ("(0, \\infty)", "[0,\\infty)", F, T),
    (r"(-\infty, 2) \cup (3, \infty)", r"(-\infty,2)\cup(3,\infty)", T, T),
    (r"(-\infty, 2] \cup (3, \infty)", r"(-\infty,2)\cup(3,\infty)", F, T),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", T, T),
    (r"\begin{pmatrix} 2 \\ 1 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", F, T),
    (
        r"\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}",
        r"\begin{pmatrix} -\frac{1}{3} \\ \frac{2}{3} \\ \frac{5}{3} \end{pmatrix}",
        T,
        T,
    ),
    ("3, 5, 7", "3, 5, 7", T, T),
    ("3,5,7", "3, 5, 7", T, T),
    ("1,-2", "1, -2", T, T),
    ("x = 5", "x=5", T, T),
    ("5", "x=5", T, T),
    ("y = 2x + 3", "y=2x+3", T, T),
    ("y = 2x - 3", "y=2x+3", F, T),
    ("90^\\circ", "90", T, T),
    ("90^{\\circ}", "90^\\circ", T, T),
    ("45^\\circ", "90^\\circ", F, T),
    (r"\frac{270}{7}", r"\frac{270}7\text{ degrees}", T, T),
    ("864", r"864 \mbox{ inches}^2", T, T),
    ("10080", r"10,\!080", T, T),
    ("11111111100", r"11,\! 111,\! 111,\! 100", T, T),
    ("32348", r"\$32,\!348", T, T),
    ("16386.16", r"\$16,\!386.16", T, T),
    ("7.2", r"7.2\%", T, T),
    (r"\text{(C)}", r"\text{(C)}", T, T),
    ("(C)", r"\text{(C)}", T, T),
    ("C", r"\text{(C)}", T, T),
    ("B", r"\text{(C)}", F, T),
    ("Evelyn", r"\text{Evelyn}", T, T),
    ("east", r"\text{east}", T, T),
    ("West", r"\text{east}", F, T),
    (r"\text{even}", r"\text{even}", T, T),
    ("a^2b^2", "a^2 b^2", T, T),  # two superscripts, not a power tower
    (r"\frac{1}{2004!}", r"\dfrac{1}{2004!}", T, T),  # a real MATH gold with a factorial
    (r"\frac{1}{2004}", r"\frac{1}{2004!}", F, T),
    ("odd", r"\text{even}", F, T),
]

# Text verbatim from SmolLM2-135M-Instruct samples (an extracted answer, or the final line it wrote when
# it never closed an answer block), against the question's gold and, where it states another value,
# against that value. The 135M model is rarely right, so the "true" half checks that the grader reads
# the value the text states.
SMOLLM2_CASES = [
    # synthetic test questions
    ("109", "69", F, T),  # What is 41 + 28?
    ("41 + 28 = 102.", "69", F, T),
    ("41 + 28 = 102.", "102", T, T),
    ("41 + 28 = 92.", "69", F, T),
    ("21 + 28 equals 105.", "69", F, T),
    ("21 + 28 equals 105.", "105", T, T),
    ("19 + 14 = 23.", "33", F, T),  # What is 19 + 14?
    ("19 + 14 = 23.", "23", T, T),
    ("So, the answer is 21.", "33", F, T),
    ("So, the answer is 21.", "21", T, T),
    ("14 + 19 = 22.", "33", F, T),
    ("7 + 49 = 28.", "56", F, T),  # What is 7 + 49?
    ("41 + 45 ≡ 6 (mod 29)", "86", F, T),  # What is 41 + 45?
    ("36", "86", F, T),
    ("6+29 = 11.", "35", F, T),  # What is 6 + 29?
    ("Fifty - 45 = 6.", "5", F, T),  # What is 50 - 45?
    ("Fifty - 45 = 6.", "6", T, T),
    ("50 - 45 = 2.", "5", F, T),
    ("5", "5", T, T),
    ("43 + 24 = 68.", "67", F, T),  # What is 43 + 24?
    ("43 + 24 = 68.", "68", T, T),
    ("43 + 24 = 10,", "67", F, T),
    ("2 + 32 = 2 * 3 + 3 * 3 = 8 + 36 = 42.", "59", F, T),  # What is 27 + 32?
    ("2 + 32 = 2 * 3 + 3 * 3 = 8 + 36 = 42.", "42", T, T),
    ("27 + 32 equals 69.", "59", F, T),
    ("27 + 32 equals 69.", "69", T, T),
    # MATH-500
    ("19", ".35625", F, T),
    ("19", "0.35625", F, T),
    # GSM8K test
    ("The answer is 13.", "3", F, T),
    ("The answer is 13.", "13", T, T),
    ("#### 2.8\nThe answer is: 2.8", "1248", F, T),
    ("#### 2.8\nThe answer is: 2.8", "2.8", T, T),
    ("So John makes $2.80 per week in a month.", "2.8", T, T),
    ("So John makes $2.80 per week in a month.", "1248", F, T),
    ("Total age = Nani + his brother + his sister = 23 + 14 +", "30", F, T),
    ("ears = 22 years + 6 years = 30 years old.", "30", T, T),
    ("The absolute value of 2 is 2, which simplifies to 2.2, which equals 2.", "30", F, T),
    ("The absolute value of 2 is 2, which simplifies to 2.2, which equals 2.", "2", T, T),
    ("The total number of books they read is double of each other's reading: 2 x 2 = 4 books.", "6", F, T),
    ("The total number of books they read is double of each other's reading: 2 x 2 = 4 books.", "4", T, T),
    ("Thus, Sean has a total of 3 * 6 + 8 * 2 = 34.", "138", F, T),
    ("Thus, Sean has a total of 3 * 6 + 8 * 2 = 34.", "34", T, T),
    ("one-tenth\n<not a 10-addition \n\nx = 20, 9x ≡ 20", "3", F, T),
    ("2", "3", F, T),
    ("240", "540", F, T),
    ("60 + 180 = 220 meters, James runs 220 meters.", "540", F, T),
    ("60 + 180 = 220 meters, James runs 220 meters.", "220", T, T),
    ("So James runs 90 / 3 (3 times a week) = 240 total meters.", "540", F, T),
    ("So James runs 90 / 3 (3 times a week) = 240 total meters.", "240", T, T),
]

CASES = MODEL_STYLE_CASES + SMOLLM2_CASES

# Adversarial answers: each must be graded wrong, fast, in any thread or process.
ADVERSARIAL = {
    "1 MB of digits": "9" * 1_000_000,
    "1 MB of LaTeX": r"\frac{1}{2}+" * 90_000,
    "power tower, bare": "^".join(["9"] * 300),
    "power tower, short": "9^9^9^9^9^9^9",
    "power tower, braced": "10^{10^{10^{10}}}",
    "power tower, parenthesized": "((9^9)^9)^9",
    "nested frac, thousands": "\\frac{" * 5000 + "1" + "}{2}" * 5000,
    "nested frac, forty": "\\frac{" * 40 + "1" + "}{2}" * 40,
    "nested sqrt": "\\sqrt{" * 2000 + "2" + "}" * 2000,
    "nested parentheses": "(" * 5000 + "1" + ")" * 5000,
    "huge exponent": "2^{10000000}",
    "exponent of a power": "(10^{9999})^{9999}",
    "factorial": "1000000!",
    "factorial chain": "3!!!!",
    "factorial of factorial": "((3!)!)!",
    "binomial": r"\binom{1000000}{500000}",
    "sum": r"\sum_{i=1}^{10^{9}} i",
    "integral": r"\int_0^1 x^{2} dx",
    "huge float": "1e999999999",
    "expansion": "(x+y+z+w)^{60}",
    "exp of a big number": "e^{10^{6}}",
    "code": "__import__('os').system('echo pwned')",
    "unbalanced braces": "{" * 10_000,
    "many boxes": "\\boxed{" * 20_000,
}


def time_grading(pairs):
    """[(seconds, verdict)] for is_equivalent(prediction, gold) on each pair, timed in this process."""
    import time

    from gtpo.grading.equivalence import is_equivalent

    results = []
    for prediction, gold in pairs:
        start = time.perf_counter()
        verdict = is_equivalent(prediction, gold)
        results.append((time.perf_counter() - start, verdict))
    return results
