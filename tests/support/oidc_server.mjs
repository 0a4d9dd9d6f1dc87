// A real OpenID Provider (oidc-provider, in development mode) on loopback for the gateway's OAuth tests.
//
//   node oidc_server.mjs <node_modules directory> <config.json>
//
// config.json: {"port", "resource", "keys": [private JWKs, the first signs], "clients": [{client_id,
// client_secret, scope, tenant}]}. It issues client-credentials access tokens as JWTs whose `aud` is the
// resource (RFC 8707), with the client's `tenant` as a claim. Prints "listening <issuer>" when ready.
//
// For end users' tokens (tests/test_vault.py), optionally: "upstream": {resource, scope, accessTokenTTL}
// (a protected upstream's JWT access tokens), "userClients": [{client_id, client_secret, redirect_uris}]
// (authorization code + PKCE, refresh tokens rotated on every use, revocation), and "exchangeClients":
// [{client_id, client_secret}] (RFC 8693 token exchange of this provider's own access tokens). A user logs
// in and consents in one step: POST /interaction/<uid> with `login=<account>` (the scripted browser).
//
// For MCP clients' identities: "registration": true (RFC 7591 dynamic registration at /reg), and
// "metadataDocuments": true (Client ID Metadata Documents, which oidc-provider 8 lacks: a client_id that is an
// http(s) URL names the JSON document fetched there, taken when its own client_id is that URL; the discovery
// document says `client_id_metadata_document_supported`). Each document fetched is logged as "document <url>
// <status>", each registration as "registered <client_id>".
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// The package lives in the project's own folder (the Makefile installs it), not next to this script.
const { default: Provider, errors } = await import(pathToFileURL(join(process.argv[2], 'oidc-provider', 'lib', 'index.js')));
// oidc-provider's own jose (5.x): another package in the folder (server-everything) may put a newer one on top.
const nestedJose = join(process.argv[2], 'oidc-provider', 'node_modules', 'jose');
const josePath = existsSync(nestedJose) ? nestedJose : join(process.argv[2], 'jose');
const jose = await import(pathToFileURL(join(josePath, 'dist', 'node', 'esm', 'index.js')));
const { default: MemoryAdapter } = await import(pathToFileURL(join(process.argv[2], 'oidc-provider', 'lib', 'adapters', 'memory_adapter.js')));
const config = JSON.parse(readFileSync(process.argv[3], 'utf8'));

class MetadataDocuments extends MemoryAdapter {
  async find(id) {
    if (this.model !== 'Client' || !/^https?:\/\//.test(id)) return super.find(id);
    const answer = await fetch(id, { redirect: 'error', headers: { accept: 'application/json' } });
    console.log(`document ${id} ${answer.status}`);
    if (!answer.ok) return undefined;
    const document = await answer.json();
    return document.client_id === id ? document : undefined;
  }
}
const upstream = config.upstream || null;
const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token';
const OIDC_SCOPES = new Set(['openid', 'offline_access']);
const issuer = `http://127.0.0.1:${config.port}`;
const tenants = Object.fromEntries(config.clients.map((c) => [c.client_id, c.tenant]));
// What each client may get at the resource: a client asking for more (an MCP client asks for every scope
// the resource's metadata lists) is given its own share, as resource servers' scopes work here.
const allowed = Object.fromEntries(config.clients.map((c) => [c.client_id, c.scope]));

const provider = new Provider(issuer, {
  jwks: { keys: config.keys },
  clients: [
    ...config.clients.map(({ client_id, client_secret }) => ({
      client_id,
      client_secret,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_basic',
    })),
    ...(config.userClients || []).map(({ client_id, client_secret, redirect_uris }) => ({
      client_id,
      client_secret,
      grant_types: ['authorization_code', 'refresh_token'],
      redirect_uris,
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_post',
    })),
    ...(config.exchangeClients || []).map(({ client_id, client_secret }) => ({
      client_id,
      client_secret,
      grant_types: [TOKEN_EXCHANGE],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_post',
    })),
  ],
  pkce: { methods: ['S256'], required: () => true },
  ...(config.metadataDocuments ? { adapter: MetadataDocuments } : {}),
  discovery: config.metadataDocuments ? { client_id_metadata_document_supported: true } : {},
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  rotateRefreshToken: true,
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  cookies: { keys: ['toolworker-tests-only'] },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    registration: { enabled: !!config.registration },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => config.resource,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource, client) => {
        if (upstream && resource === upstream.resource) {
          return { scope: upstream.scope, audience: resource, accessTokenTTL: upstream.accessTokenTTL, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } };
        }
        if (resource !== config.resource) throw new Error(`unknown resource ${resource}`);
        return { scope: allowed[client.clientId], audience: resource, accessTokenTTL: 300, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } };
      },
    },
  },
  extraTokenClaims: (ctx, token) => ({ tenant: tenants[token.clientId] }),
  ttl: { ClientCredentials: 300, RefreshToken: 3600, Grant: 3600, Session: 3600, Interaction: 600, AuthorizationCode: 60 },
});

// The login and consent page of the scripted browser: GET shows a form, POST logs `login` in and grants
// what the client asked for.
provider.use(async (ctx, next) => {
  const match = ctx.path.match(/^\/interaction\/([^/]+)$/);
  if (!match) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (ctx.method === 'GET') {
    ctx.type = 'html';
    ctx.body = `<form method="post" action="/interaction/${details.uid}"><input name="login"><button>Allow</button></form>`;
    return undefined;
  }
  const form = new URLSearchParams(await new Promise((resolve) => {
    let data = '';
    ctx.req.on('data', (chunk) => { data += chunk; });
    ctx.req.on('end', () => resolve(data));
  }));
  const accountId = form.get('login');
  const { params } = details;
  const requested = String(params.scope || '').split(' ').filter(Boolean);
  const grant = new provider.Grant({ accountId, clientId: params.client_id });
  grant.addOIDCScope(requested.filter((s) => OIDC_SCOPES.has(s)).join(' '));
  // The upstream's scopes, as its resource server offers them: a scope it does not offer is not granted.
  const offered = upstream && params.resource === upstream.resource ? new Set(upstream.scope.split(' ')) : null;
  const granted = requested.filter((s) => !OIDC_SCOPES.has(s) && (!offered || offered.has(s)));
  if (params.resource) grant.addResourceScope(params.resource, granted.join(' '));
  const grantId = await grant.save();
  await provider.interactionFinished(ctx.req, ctx.res, { login: { accountId }, consent: { grantId } }, { mergeWithLastSubmission: false });
  ctx.respond = false;
  return undefined;
});

// RFC 8693: this provider's own access tokens (for the gateway's resource) exchanged for the upstream's.
if ((config.exchangeClients || []).length) {
  const signing = await jose.importJWK(config.keys[0], 'RS256');
  const verifying = jose.createLocalJWKSet({ keys: config.keys.map(({ d, p, q, dp, dq, qi, ...pub }) => pub) });
  provider.registerGrantType(TOKEN_EXCHANGE, async (ctx, next) => {
    const { params } = ctx.oidc;
    if (params.subject_token_type !== ACCESS_TOKEN_TYPE) throw new errors.InvalidRequest('unsupported subject_token_type');
    let subject;
    try {
      ({ payload: subject } = await jose.jwtVerify(params.subject_token, verifying, { issuer, audience: config.resource }));
    } catch (error) {
      throw new errors.InvalidGrant('subject_token is not valid');
    }
    const ttl = (upstream && upstream.accessTokenTTL) || 300;
    const now = Math.floor(Date.now() / 1000);
    const token = await new jose.SignJWT({ scope: params.scope || '', client_id: ctx.oidc.client.clientId, act: { sub: ctx.oidc.client.clientId } })
      .setProtectedHeader({ alg: 'RS256', kid: config.keys[0].kid, typ: 'at+jwt' })
      .setIssuer(issuer).setSubject(subject.sub).setAudience(params.audience).setIssuedAt(now).setExpirationTime(now + ttl)
      .setJti(crypto.randomUUID())
      .sign(signing);
    ctx.body = { access_token: token, issued_token_type: ACCESS_TOKEN_TYPE, token_type: 'Bearer', expires_in: ttl, scope: params.scope || '' };
    await next();
  }, new Set(['subject_token', 'subject_token_type', 'audience', 'scope', 'requested_token_type', 'resource']));
}
provider.on('registration_create.success', (ctx, client) => console.log(`registered ${client.clientId}`));
provider.on('server_error', (ctx, error) => console.error('server_error', error));
provider.on('grant.error', (ctx, error) => console.error('grant.error', error));
provider.listen(config.port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
