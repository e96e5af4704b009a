// The npm package as an app developer meets it: the built pkg/ is packed with `npm pack`,
// installed from the tarball into a fresh copy of a Vite + TypeScript app (tests/app, copied to
// target/app-work so the tree stays clean), type-checked by the app's own tsc (strict,
// skipLibCheck false), bundled by `vite build`, and run in headless Chromium from kizuna-server,
// which serves the bundle. The row the app writes must reach PostgreSQL and come back to a second
// device. Run by scripts/app-test.sh, which starts the gateway; every step fails, never skips,
// when it cannot run.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { join, resolve } from "node:path";
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

const root = fileURLToPath(new URL("../..", import.meta.url));
const pkg = resolve(root, process.env.KIZUNA_PKG_DIR ?? "pkg");
const packDir = join(root, "target/app-pack");
const work = join(root, "target/app-work");
const url = process.env.KIZUNA_APP_URL;
const db = process.env.KIZUNA_APP_DATABASE_URL;
const sub = crypto.randomUUID();
const id = crypto.randomUUID();
let browser;

// Runs a command; on failure the assertion shows its output.
function run(cmd, args, cwd) {
  try {
    return execFileSync(cmd, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NO_COLOR: "1" } });
  } catch (e) {
    assert.fail(`${cmd} ${args.join(" ")} failed (exit ${e.status}):\n${e.stdout ?? ""}${e.stderr ?? ""}`);
  }
}

before(async () => {
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
  });
});
after(() => browser?.close());

test("the built package has its own README, real metadata and no `any` in its declarations", () => {
  assert.ok(existsSync(join(pkg, "package.json")), `${pkg} is not built: run scripts/package.sh`);
  const manifest = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8"));
  assert.equal(manifest.name, "kizunasync");
  assert.deepEqual(manifest.repository, { type: "git", url: "git+https://github.com/kizuna-sync/kizunasync.git" });
  assert.equal(manifest.types, "kizunasync.d.ts");
  assert.ok(manifest.homepage && manifest.keywords?.length > 0 && "sideEffects" in manifest);
  assert.equal(readFileSync(join(pkg, "README.md"), "utf8"), readFileSync(join(root, "npm/README.md"), "utf8"));
  for (const file of readdirSync(pkg).filter((f) => f.endsWith(".d.ts"))) {
    const lines = readFileSync(join(pkg, file), "utf8").split("\n").filter((l) => /\bany\b/.test(l));
    assert.deepEqual(lines, [], `${file} has \`any\``);
  }
});

test("npm pack the package and install the tarball into a fresh Vite + TypeScript app", () => {
  rmSync(packDir, { recursive: true, force: true });
  mkdirSync(packDir, { recursive: true });
  const [packed] = JSON.parse(run("npm", ["pack", pkg, "--pack-destination", packDir, "--json", "--silent"], root));
  const files = packed.files.map((f) => f.path).sort();
  for (const f of ["README.md", "kizunasync.d.ts", "kizunasync.js", "kizunasync_bg.wasm", "package.json"]) {
    assert.ok(files.includes(f), `the tarball lacks ${f}: ${files.join(", ")}`);
  }
  rmSync(work, { recursive: true, force: true });
  cpSync(join(root, "tests/app"), work, { recursive: true, filter: (src) => !src.endsWith(".test.mjs") });
  run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", join(packDir, packed.filename)], work);
  const installed = JSON.parse(readFileSync(join(work, "node_modules/kizunasync/package.json"), "utf8"));
  assert.equal(installed.version, packed.version);
});

test("the app type-checks with its own tsc (strict, skipLibCheck false, moduleResolution bundler)", () => {
  // tsconfig.json is JSON with comments, as the template writes it.
  const text = readFileSync(join(work, "tsconfig.json"), "utf8").replace(/\/\*[\s\S]*?\*\/|^\s*\/\/.*$/gm, "");
  const config = JSON.parse(text).compilerOptions;
  assert.equal(config.strict, true);
  assert.equal(config.skipLibCheck, false);
  assert.equal(config.moduleResolution, "bundler");
  run(join(work, "node_modules/.bin/tsc"), ["--noEmit", "-p", "."], work);
});

test("vite build bundles the app and emits the wasm", () => {
  run(join(work, "node_modules/.bin/vite"), ["build", "--logLevel", "warn"], work);
  assert.ok(existsSync(join(work, "dist/index.html")));
  const assets = readdirSync(join(work, "dist/assets"));
  assert.ok(assets.some((f) => f.endsWith(".wasm")), `no .wasm among ${assets.join(", ")}`);
});

// Opens the built app in a fresh browser context (a device of its own) and waits for its outcome.
async function device(query) {
  assert.ok(url, "KIZUNA_APP_URL is not set: run scripts/app-test.sh");
  const page = await (await browser.newContext()).newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("response", (r) => { if (r.status() >= 400) errors.push(`${r.status()} ${r.url()}`); });
  await page.goto(`${url}/?${new URLSearchParams({ sub, id, ...query })}`);
  await page.waitForFunction(() => document.body.dataset.result, null, { timeout: 30_000 });
  const data = await page.evaluate(() => ({ ...document.body.dataset }));
  return { page, data, errors };
}

test("in Chromium the app puts a row, syncs it to PostgreSQL and finds it", async () => {
  assert.ok(db, "KIZUNA_APP_DATABASE_URL is not set: run scripts/app-test.sh");
  const { page, data, errors } = await device({ mode: "write" });
  assert.equal(data.result, "synced:1", JSON.stringify(data));
  assert.equal(data.local, "1", "the query finds the row at once, before any sync");
  assert.equal(data.pending, "0");
  assert.equal(data.applied, "1");
  assert.equal(data.owner, sub, "after the pull the row is the server's, with its owner");
  if (data.watch === "yes") assert.equal(data.watched, "1");
  if (data.leader !== "undefined") assert.equal(data.leader, "true", "an only tab leads");
  assert.match(await page.locator("#app li").first().textContent(), /from the vite app/);
  assert.deepEqual(errors, []);
  const row = execFileSync("psql", [db, "-Atc", `select title, done, owner from todos where id = '${id}'`], { encoding: "utf8" }).trim();
  assert.equal(row, `from the vite app ${id}|f|${sub}`);
});

test("a second device of the same user pulls the row", async () => {
  const { data, errors } = await device({ mode: "read" });
  assert.equal(data.result, `pulled:from the vite app ${id}:false`, JSON.stringify(data));
  assert.equal(data.owner, sub);
  assert.deepEqual(errors, []);
});
