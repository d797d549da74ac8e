// A screenshot of an MLflow UI page in headless Chromium on a fresh profile (no local storage:
// what a first visit sees). Playwright with Debian's /usr/bin/chromium:
//   NODE_PATH=<dir with playwright-core> node docs/screenshot.js URL OUT.png WIDTH HEIGHT [MODE]
// MODE "chart:<text>" types <text> into the charts' search box. Prints the address the page
// ended on (MLflow rewrites it) and the runs table's column headers.
const { chromium } = require('playwright-core');
(async () => {
  const [url, out, w, h, mode] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
  const page = await browser.newPage({ viewport: { width: +w, height: +h } });
  await page.goto(url, { waitUntil: 'load', timeout: 120000 });  // the UI polls: no network idle
  await page.waitForTimeout(15000);
  // the assistant's side panel opens on a first visit
  await page.evaluate(() => document.querySelector(
    'button[data-component-id="mlflow.assistant.chat_panel.close"]')?.click());
  if (mode && mode.startsWith('chart:')) {
    await page.getByPlaceholder('Search metric charts').fill(mode.slice('chart:'.length));
  }
  await page.waitForTimeout(6000);
  console.log('address:', page.url());
  // the grid positions its header cells: their order on screen is their x, not the DOM's
  const headers = await page.evaluate(() => {
    const cells = Array.from(document.querySelectorAll('.ag-header-row-column [col-id]'));
    const seen = new Map();
    for (const c of cells) seen.set(c.getAttribute('col-id'), c.getBoundingClientRect().x);
    return [...seen].sort((a, b) => a[1] - b[1]).map(([id]) => id);
  });
  console.log('columns:', JSON.stringify(headers));
  await page.screenshot({ path: out, timeout: 180000 });
  await browser.close();
})();
