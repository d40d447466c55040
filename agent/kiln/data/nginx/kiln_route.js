// kiln's routing by model, for nginx's JavaScript module (njs): with several models on one machine, a request goes
// to the router of the model its JSON body names, and a key limited to some models is refused the others.
// nginx's configuration gives the tables: $kiln_routes (served name -> route number, JSON) and $kiln_key_models
// (the key's served names between spaces, or "" for every model). Every answer of its own is OpenAI's error shape.

function error(r, status, message, type, code, param) {
    r.headersOut['Content-Type'] = 'application/json';
    r.return(status, JSON.stringify({error: {message: message, type: type, param: param || null, code: code}}));
}

function allowed(r, model) {
    var scope = r.variables.kiln_key_models;
    return !scope || scope.indexOf(' ' + model + ' ') >= 0;
}

function routes(r) {
    return JSON.parse(r.variables.kiln_routes);
}

// The body is in memory: the routed location keeps client_body_buffer_size at client_max_body_size.
function route(r) {
    var request;
    try {
        request = JSON.parse(r.requestText || '');
    } catch (e) {
        return error(r, 400, 'the request body is not valid JSON for this API', 'invalid_request_error',
                     'invalid_json');
    }
    var table = routes(r);
    var model = request === null || typeof request !== 'object' ? undefined : request.model;
    if (typeof model !== 'string' || model === '') {
        return error(r, 400, 'name the model in `model`: this endpoint serves ' + Object.keys(table).join(', '),
                     'invalid_request_error', 'model_required', 'model');
    }
    if (!Object.prototype.hasOwnProperty.call(table, model)) {
        return error(r, 404, 'The model `' + model.substring(0, 128) + '` does not exist. This endpoint serves ' +
                     Object.keys(table).join(', ') + ' (GET /v1/models)', 'invalid_request_error',
                     'model_not_found', 'model');
    }
    if (!allowed(r, model)) {
        return error(r, 403, 'this API key may not use the model `' + model + '`; ask the owner for a key that may',
                     'invalid_request_error', 'model_not_allowed', 'model');
    }
    // vllm-router sends rerank on under a name of its own and has no score: those go to the instances themselves.
    var pooled = r.uri === '/v1/rerank' || r.uri === '/v1/score';
    r.internalRedirect((pooled ? '@kiln_pool_' : '@kiln_model_') + table[model]);
}

// Every model and adapter served here that the key may use, from each model's router.
async function models(r) {
    var table = routes(r);
    var numbers = [];
    Object.keys(table).forEach(function (name) {
        if (numbers.indexOf(table[name]) < 0) {
            numbers.push(table[name]);
        }
    });
    var replies = await Promise.all(numbers.map(function (n) {
        return r.subrequest('/.kiln-models/' + n).catch(function () { return null; });
    }));
    var data = [];
    replies.forEach(function (reply) {
        if (!reply || reply.status !== 200) {
            return;  // a model with no instance serving is left out, as its requests get 503
        }
        try {
            JSON.parse(reply.responseText).data.forEach(function (entry) {
                if (allowed(r, entry.id)) {
                    data.push(entry);
                }
            });
        } catch (e) {
            r.warn('kiln: a router answered /v1/models with something else than its list');
        }
    });
    r.headersOut['Content-Type'] = 'application/json';
    r.return(200, JSON.stringify({object: 'list', data: data}));
}

export default {route, models};
