//! `#[boundary]` and `#[boundary(FAIL)]`: for an `extern "C"` function of libcascade (a
//! wrapper, a callback handed to glibc, a load/fork handler), the body `{ B }` becomes
//! `{ crate::interpose::catch_panic("name", || { B }) }` (or `catch_panic_or("name", FAIL,
//! || { B })`), so that a panic inside the library (store code that meets a corrupt shared
//! block, say) fails the call with the function's error value and EIO, with one line on
//! stderr, instead of unwinding into C, which aborts the host program. The default error
//! value comes from the return type (`crate::interpose::OnPanic`: -1, a null pointer,
//! nothing); `FAIL` is for functions that return an error number (posix_spawn, glob...)
//! or another sentinel (mmap's MAP_FAILED). A function returning `!` is left as it is.
//!
//! Written on `proc_macro` alone (no syn/quote): only the function's name, its return type's
//! `!` and its body (the last token, a brace group) are looked at; everything else is passed
//! through untouched.

use proc_macro::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};

#[proc_macro_attribute]
pub fn boundary(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut tokens: Vec<TokenTree> = item.into_iter().collect();
    let mut name = None;
    let mut diverges = false;
    for (i, t) in tokens.iter().enumerate() {
        match t {
            TokenTree::Ident(id) if name.is_none() && id.to_string() == "fn" => {
                if let Some(TokenTree::Ident(n)) = tokens.get(i + 1) {
                    name = Some(n.to_string());
                }
            }
            TokenTree::Punct(p) if p.as_char() == '>' && i > 0 => {
                let arrow = matches!(&tokens[i - 1], TokenTree::Punct(q) if q.as_char() == '-');
                let bang =
                    matches!(tokens.get(i + 1), Some(TokenTree::Punct(b)) if b.as_char() == '!');
                diverges |= arrow && bang;
            }
            _ => {}
        }
    }
    let Some(name) = name else {
        return error("#[boundary] goes on a function");
    };
    let body = match tokens.last() {
        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => g.clone(),
        _ => return error("#[boundary] needs a function with a body"),
    };
    if diverges {
        return tokens.into_iter().collect();
    }
    let has_fail = !attr.is_empty();
    let helper = if has_fail {
        "crate::interpose::catch_panic_or"
    } else {
        "crate::interpose::catch_panic"
    };
    let mut args: Vec<TokenTree> = vec![TokenTree::Literal(Literal::string(&name))];
    args.push(TokenTree::Punct(Punct::new(',', Spacing::Alone)));
    if has_fail {
        args.push(TokenTree::Group(Group::new(Delimiter::Parenthesis, attr)));
        args.push(TokenTree::Punct(Punct::new(',', Spacing::Alone)));
    }
    args.push(TokenTree::Punct(Punct::new('|', Spacing::Joint)));
    args.push(TokenTree::Punct(Punct::new('|', Spacing::Alone)));
    args.push(TokenTree::Group(body.clone()));
    let mut call: Vec<TokenTree> = match helper.parse::<TokenStream>() {
        Ok(path) => path.into_iter().collect(),
        Err(_) => return error("#[boundary]: bad helper path"),
    };
    call.push(TokenTree::Group(Group::new(
        Delimiter::Parenthesis,
        args.into_iter().collect(),
    )));
    let mut new_body = Group::new(Delimiter::Brace, call.into_iter().collect());
    new_body.set_span(body.span());
    if let Some(last) = tokens.last_mut() {
        *last = TokenTree::Group(new_body);
    }
    tokens.into_iter().collect()
}

fn error(message: &str) -> TokenStream {
    let mut out: Vec<TokenTree> = vec![
        TokenTree::Ident(Ident::new("compile_error", Span::call_site())),
        TokenTree::Punct(Punct::new('!', Spacing::Alone)),
    ];
    out.push(TokenTree::Group(Group::new(
        Delimiter::Parenthesis,
        std::iter::once(TokenTree::Literal(Literal::string(message))).collect(),
    )));
    out.push(TokenTree::Punct(Punct::new(';', Spacing::Alone)));
    out.into_iter().collect()
}
