// A real OpenID Provider (oidc-provider, in development mode) on loopback for the gateway's OAuth tests.
//
//   node oidc_server.mjs <node_modules directory> <config.json>
//
// config.json: {"port", "resource", "keys": [private JWKs, the first signs], "clients": [{client_id,
// client_secret, scope, tenant}]}. It issues client-credentials access tokens as JWTs whose `aud` is the
// resource (RFC 8707), with the client's `tenant` as a claim. Prints "listening <issuer>" when ready.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// The package lives in the project's own folder (the Makefile installs it), not next to this script.
const { default: Provider } = await import(pathToFileURL(join(process.argv[2], 'oidc-provider', 'lib', 'index.js')));
const config = JSON.parse(readFileSync(process.argv[3], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;
const tenants = Object.fromEntries(config.clients.map((c) => [c.client_id, c.tenant]));
// What each client may get at the resource: a client asking for more (an MCP client asks for every scope
// the resource's metadata lists) is given its own share, as resource servers' scopes work here.
const allowed = Object.fromEntries(config.clients.map((c) => [c.client_id, c.scope]));

const provider = new Provider(issuer, {
  jwks: { keys: config.keys },
  clients: config.clients.map(({ client_id, client_secret }) => ({
    client_id,
    client_secret,
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_basic',
  })),
  cookies: { keys: ['toolworker-tests-only'] },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => config.resource,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource, client) => {
        if (resource !== config.resource) throw new Error(`unknown resource ${resource}`);
        return { scope: allowed[client.clientId], audience: resource, accessTokenTTL: 300, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } };
      },
    },
  },
  extraTokenClaims: (ctx, token) => ({ tenant: tenants[token.clientId] }),
  ttl: { ClientCredentials: 300 },
});
provider.on('server_error', (ctx, error) => console.error('server_error', error));
provider.on('grant.error', (ctx, error) => console.error('grant.error', error));
provider.listen(config.port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
