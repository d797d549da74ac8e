const { chromium } = require('playwright-core');
(async () => {
  const [url, out, w, h, mode] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
  const page = await browser.newPage({ viewport: { width: +w, height: +h } });
  await page.goto(url, { waitUntil: 'networkidle' });
  await page.waitForTimeout(3000);
  // close the assistant side panel if it is open
  const close = page.locator('button[aria-label="Close"]').first();
  try { await page.mouse.click(1562, 34); } catch (e) {}
  if (mode && mode.startsWith('chart')) {
    const q = mode.split(':')[1];
    if (q) { await page.getByPlaceholder('Search metric charts').fill(q); }
    await page.waitForTimeout(6000);
  }
  await page.waitForTimeout(2000);
  await page.screenshot({ path: out });
  await browser.close();
})();
