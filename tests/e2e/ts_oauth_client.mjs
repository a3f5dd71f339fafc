// The official TypeScript SDK's OAuth client (StreamableHTTPClientTransport + an
// OAuthClientProvider), driven by a test over JSON lines (tests/e2e/ts_sdk.py): commands on
// stdin, answers and events on stdout. The SDK's directory is TS_SDK_DIR (its dist/esm).
//
// Commands: {"op":"connect","url":...} (emits {"event":"authorize","url":...} when the person
// must consent, then waits for {"op":"code","location":...}, the redirect back);
// {"op":"calls","n":3,"text":"x","refreshes":3} (n tools/call echo at once; token saves wait
// until `refreshes` refresh requests were sent, as a slow keychain write would);
// {"op":"tokens"}; {"op":"set_access","token":...}. Every answer is {"ok":...} or
// {"error":...}, and carries "wire": the token and registration requests seen so far.
import readline from 'node:readline';
import { pathToFileURL } from 'node:url';

const sdk = process.env.TS_SDK_DIR;
const { Client } = await import(pathToFileURL(`${sdk}/client/index.js`).href);
const { StreamableHTTPClientTransport } = await import(pathToFileURL(`${sdk}/client/streamableHttp.js`).href);
const { UnauthorizedError } = await import(pathToFileURL(`${sdk}/client/auth.js`).href);

const REDIRECT = process.env.REDIRECT_URI;
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const next = async () => JSON.parse((await lines.next()).value);

const wire = []; // [path, status, grant_type, error]
let refreshesSent = 0;
let refreshesWanted = 0;

async function counted(url, init) {
    const path = new URL(url).pathname;
    let grant = '';
    if (path === '/oauth/token' && init?.body) {
        grant = new URLSearchParams(init.body.toString()).get('grant_type') ?? '';
        if (grant === 'refresh_token') refreshesSent += 1;
    }
    const response = await fetch(url, init);
    if (path.startsWith('/oauth/')) {
        let error = '';
        if (response.status >= 400) {
            try { error = (await response.clone().json()).error ?? ''; } catch { /* not JSON */ }
        }
        wire.push([path, response.status, grant, error]);
    }
    return response;
}

async function waitForRefreshes() {
    const end = Date.now() + 5000;
    while (refreshesSent < refreshesWanted && Date.now() < end) {
        await new Promise((resolve) => setTimeout(resolve, 5));
    }
}

class Provider {
    constructor() { this.saved = undefined; this.client = undefined; this.verifier = undefined; this.authorizations = 0; }
    get redirectUrl() { return REDIRECT; }
    get clientMetadata() {
        return { client_name: 'ts sdk e2e', redirect_uris: [REDIRECT], token_endpoint_auth_method: 'none',
                 grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'] };
    }
    clientInformation() { return this.client; }
    saveClientInformation(info) { this.client = info; }
    tokens() { return this.saved; }
    async saveTokens(tokens) { await waitForRefreshes(); this.saved = tokens; }
    redirectToAuthorization(url) { this.authorizations += 1; say({ event: 'authorize', url: url.href }); }
    saveCodeVerifier(verifier) { this.verifier = verifier; }
    codeVerifier() { return this.verifier; }
}

const provider = new Provider();
let client;

async function connect(url) {
    const open = () => new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: counted });
    client = new Client({ name: 'ts-sdk-e2e', version: '0' });
    let transport = open();
    try {
        await client.connect(transport);
        return 'connected';
    } catch (error) {
        if (!(error instanceof UnauthorizedError)) throw error;
    }
    const back = new URL((await next()).location);
    if (back.searchParams.get('error')) {
        return { error: back.searchParams.get('error'), description: back.searchParams.get('error_description') };
    }
    await transport.finishAuth(back.searchParams.get('code'));
    client = new Client({ name: 'ts-sdk-e2e', version: '0' });
    transport = open();
    await client.connect(transport);
    return 'connected';
}

async function calls(n, text, refreshes) {
    refreshesSent = 0;
    refreshesWanted = refreshes ?? 0;
    const settled = await Promise.allSettled(Array.from({ length: n }, (_, i) =>
        client.callTool({ name: 'echo', arguments: { text: `${text}-${i}` } })));
    refreshesWanted = 0;
    return settled.map((s) => s.status === 'fulfilled'
        ? { text: s.value.content?.[0]?.text ?? null }
        : { failed: `${s.reason?.constructor?.name}: ${s.reason?.message}` });
}

for (;;) {
    const { value, done } = await lines.next();
    if (done) break;
    const command = JSON.parse(value);
    try {
        let ok;
        if (command.op === 'connect') ok = await connect(command.url);
        else if (command.op === 'calls') ok = await calls(command.n, command.text, command.refreshes);
        else if (command.op === 'tokens') ok = provider.saved ?? null;
        else if (command.op === 'set_access') { provider.saved = { ...provider.saved, access_token: command.token }; ok = true; }
        else if (command.op === 'authorizations') ok = provider.authorizations;
        else throw new Error(`unknown op ${command.op}`);
        say({ ok, wire });
    } catch (error) {
        say({ error: `${error?.constructor?.name}: ${error?.message}`, wire });
    }
}
process.exit(0);
