#!/usr/bin/env node
// Open a `timeline report` page from disk in headless Chromium (no server, no network), wait
// for its charts, save a screenshot and print {"load_ms", "svgs", "rows", "errors"} as JSON —
// console errors and page errors included, so a test can require none.
//
//   node tools/browser/report_screenshot.js REPORT.html OUT.png [CHROMIUM]
'use strict';
const path = require('path');
const { chromium } = require('playwright-core');

async function main() {
  const [page_, out, exe] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: exe || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 1400 } });
    const errors = [];
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    page.on('request', (r) => { if (!r.url().startsWith('file:')) errors.push('request: ' + r.url()); });
    const t0 = Date.now();
    await page.goto('file://' + path.resolve(page_));
    await page.waitForSelector('svg', { timeout: 5000 });
    const load_ms = Date.now() - t0;
    await page.waitForTimeout(300);
    await page.screenshot({ path: out, fullPage: false });
    const svgs = await page.locator('svg').count();
    const rows = await page.locator('tbody tr').count();
    process.stdout.write(JSON.stringify({ load_ms, svgs, rows, errors }));
  } finally {
    await browser.close();
  }
}

main().catch((err) => { process.stderr.write(String(err && err.stack || err) + '\n'); process.exit(1); });
