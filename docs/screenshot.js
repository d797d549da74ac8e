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
  const close = page.locator('button[data-component-id="mlflow.assistant.chat_panel.close"]');
  if (await close.count()) { await close.first().click(); }
  if (mode && mode.startsWith('chart:')) {
    await page.getByPlaceholder('Search metric charts').fill(mode.slice('chart:'.length));
  }
  await page.waitForTimeout(6000);
  console.log('address:', page.url());
  const headers = await page.locator('[role="columnheader"]').allInnerTexts();
  console.log('columns:', JSON.stringify(headers));
  await page.screenshot({ path: out });
  await browser.close();
})();
