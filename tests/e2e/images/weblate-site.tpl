# the site of the weblate/weblate LOOK-ALIKE (start writes it to /tmp/nginx/weblate-site.conf), after
# WeblateOrg/docker's etc/nginx/default.tpl without HTTPS, IPv6 and Anubis: port 8080, static and
# media files, the rest to granian's socket
server {
    listen 8080 default_server;
    root /app/cache/static;
    client_max_body_size @CLIENT_MAX_BODY_SIZE@;
    server_tokens off;
    port_in_redirect off;

    location ~ ^/favicon.ico$ {
        alias /app/cache/static/favicon.ico;
        expires 30d;
    }
    location /static/ {
        alias /app/cache/static/;
        expires 30d;
    }
    location /media/ {
        alias /app/data/media/;
        expires 30d;
    }
    proxy_set_header Host $http_host;
    proxy_read_timeout 3600;
    proxy_connect_timeout 3600;
    location / {
        proxy_pass http://unix:@GRANIAN_SOCKET@:;
    }
}
