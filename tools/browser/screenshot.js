#!/usr/bin/env node
// Open a trace in the Perfetto UI served on loopback and save a screenshot (headless Chromium
// driven by playwright-core; ../shared/reference/perfetto.md §4.2).
//
//   node tools/browser/screenshot.js URL OUT.png [CHROMIUM] [HEIGHT]
//
// URL is the UI with #!/viewer?url=… pointing at the trace on the same server. Waits for the
// tracks, expands the first process group, saves OUT.png, and prints the number of track
// elements and the page's error text (if any) as JSON. HEIGHT: the viewport's (default 1000 px).
'use strict';
const { chromium } = require('playwright-core');

async function main() {
  const [url, out, exe, height] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: exe || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1600, height: Number(height) || 1000 } });
    await page.goto(url);
    const tracks = '.pf-track, .pf-track-shell, .track, .track-shell';
    await page.waitForSelector(tracks, { timeout: 60000 });
    await page.waitForTimeout(1500);
    const group = page.getByText(/^rank \d+/).first();
    if (await group.count()) await group.click().catch(() => {});
    await page.waitForTimeout(1500);
    await page.screenshot({ path: out });
    const count = await page.locator(tracks).count();
    const errors = await page.locator('.pf-error, .error').allInnerTexts().catch(() => []);
    process.stdout.write(JSON.stringify({ tracks: count, errors }));
  } finally {
    await browser.close();
  }
}

main().catch((err) => { process.stderr.write(String(err && err.stack || err) + '\n'); process.exit(1); });
