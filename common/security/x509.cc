#include "common/security/x509.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo::security {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StackFree {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
struct CtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

std::unique_ptr<BIO, BioFree> MemoryBio(absl::string_view pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in a PEM text, in order, up to the first that does not
// parse.
std::vector<X509Ptr> ReadCertificates(absl::string_view pem) {
  std::vector<X509Ptr> out;
  auto bio = MemoryBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the end of the text is a "no start line" error
  return out;
}

// How many certificate blocks a PEM text opens, parsed or not.
size_t CertificateBlocks(absl::string_view pem) {
  size_t n = 0;
  for (absl::string_view begin :
       {"-----BEGIN CERTIFICATE-----", "-----BEGIN X509 CERTIFICATE-----"}) {
    for (size_t at = pem.find(begin); at != absl::string_view::npos; at = pem.find(begin, at + 1)) {
      ++n;
    }
  }
  return n;
}

// Every certificate of a PEM text, or why not: none, or a block that does
// not parse (a file cut short, say).
absl::StatusOr<std::vector<X509Ptr>> ReadAllCertificates(absl::string_view pem,
                                                         absl::string_view what,
                                                         absl::string_view name) {
  std::vector<X509Ptr> certs = ReadCertificates(pem);
  const size_t blocks = CertificateBlocks(pem);
  if (certs.empty() && blocks == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", name, pem.empty() ? " is empty" : " holds no PEM certificate"));
  }
  if (certs.size() < std::max<size_t>(blocks, 1)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", name, ": certificate ",
                                                   certs.size() + 1, " of ", blocks,
                                                   " does not parse (a file cut short?)"));
  }
  return certs;
}

int NoPassword(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return 0; }

std::unique_ptr<EVP_PKEY, KeyFree> ReadKey(absl::string_view pem) {
  auto bio = MemoryBio(pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr));
  ERR_clear_error();
  return key;
}

std::string TimeText(const ASN1_TIME* t) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// "" when `cert` is valid at `now`, else why not.
std::string ValidityFault(X509* cert, time_t now) {
  if (X509_cmp_time(X509_get0_notAfter(cert), &now) < 0) {
    return absl::StrCat("expired on ", TimeText(X509_get0_notAfter(cert)));
  }
  if (X509_cmp_time(X509_get0_notBefore(cert), &now) > 0) {
    return absl::StrCat("is not valid before ", TimeText(X509_get0_notBefore(cert)));
  }
  return "";
}

std::string AltName(const GENERAL_NAME* n) {
  int type = 0;
  const void* value = GENERAL_NAME_get0_value(n, &type);
  if (type == GEN_DNS || type == GEN_URI || type == GEN_EMAIL) {
    const auto* s = static_cast<const ASN1_STRING*>(value);
    return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                       static_cast<size_t>(ASN1_STRING_length(s)));
  }
  if (type == GEN_IPADD) {
    const auto* s = static_cast<const ASN1_OCTET_STRING*>(value);
    char text[INET6_ADDRSTRLEN] = {};
    const int len = ASN1_STRING_length(s);
    if (len != 4 && len != 16) return "";
    inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(s), text, sizeof(text));
    return text;
  }
  return "";
}

CertificateIdentity IdentityOf(X509* cert) {
  CertificateIdentity id;
  X509_NAME* subject = X509_get_subject_name(cert);
  const int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (i >= 0) {
    const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    id.common_name.assign(reinterpret_cast<const char*>(ASN1_STRING_get0_data(cn)),
                          static_cast<size_t>(ASN1_STRING_length(cn)));
  }
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names != nullptr) {
    for (int k = 0; k < sk_GENERAL_NAME_num(names); ++k) {
      std::string name = AltName(sk_GENERAL_NAME_value(names, k));
      if (!name.empty()) id.alt_names.push_back(std::move(name));
    }
    GENERAL_NAMES_free(names);
  }
  return id;
}

}  // namespace

std::string Sha256(absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string Sha256Hex(absl::string_view data) {
  const std::string md = Sha256(data);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * md.size());
  for (unsigned char c : md) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat(what, " ", path, " cannot be read: ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status CheckCertificateText(absl::string_view pem, absl::string_view name, absl::Time now) {
  auto certs = ReadAllCertificates(pem, "certificate", name);
  if (!certs.ok()) return certs.status();
  const std::string fault = ValidityFault(certs->front().get(), absl::ToTimeT(now));
  if (!fault.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("certificate ", name, " ", fault));
  }
  return absl::OkStatus();
}

absl::Status CheckPrivateKeyText(absl::string_view pem, absl::string_view name) {
  if (ReadKey(pem) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key ", name, pem.empty() ? " is empty" : " holds no unencrypted PEM private key"));
  }
  return absl::OkStatus();
}

absl::Status CheckKeyMatches(absl::string_view cert_pem, absl::string_view key_pem,
                             absl::string_view cert_name, absl::string_view key_name) {
  std::vector<X509Ptr> certs = ReadCertificates(cert_pem);
  auto key = ReadKey(key_pem);
  if (certs.empty() || key == nullptr ||
      X509_check_private_key(certs.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("key ", key_name, " is not the key of certificate ", cert_name));
  }
  return absl::OkStatus();
}

absl::Status CheckCaText(absl::string_view pem, absl::string_view name, absl::Time now) {
  auto certs = ReadAllCertificates(pem, "CA file", name);
  if (!certs.ok()) return certs.status();
  std::string fault;
  for (const X509Ptr& cert : *certs) {
    fault = ValidityFault(cert.get(), absl::ToTimeT(now));
    if (fault.empty()) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "CA file ", name, ": no certificate of it is valid now (the last one ", fault, ")"));
}

absl::StatusOr<absl::Time> CertificateNotAfter(absl::string_view pem) {
  std::vector<X509Ptr> certs = ReadCertificates(pem);
  struct tm tm {};
  if (certs.empty() || ASN1_TIME_to_tm(X509_get0_notAfter(certs.front().get()), &tm) != 1) {
    return absl::InvalidArgumentError("no certificate to read an expiry date from");
  }
  return absl::FromTimeT(timegm(&tm));
}

absl::Status CheckKeyPair(const std::string& cert_file, const std::string& key_file) {
  const auto cert_pem = ReadSecretFile(cert_file, "certificate");
  if (!cert_pem.ok()) return absl::InvalidArgumentError(cert_pem.status().message());
  const auto key_pem = ReadSecretFile(key_file, "key");
  if (!key_pem.ok()) return absl::InvalidArgumentError(key_pem.status().message());
  const absl::Time now = absl::Now();
  if (auto certs = ReadAllCertificates(*cert_pem, "certificate", cert_file); !certs.ok()) {
    return certs.status();
  }
  ASYMPO_RETURN_IF_ERROR(CheckPrivateKeyText(*key_pem, key_file));
  ASYMPO_RETURN_IF_ERROR(CheckKeyMatches(*cert_pem, *key_pem, cert_file, key_file));
  return CheckCertificateText(*cert_pem, cert_file, now);
}

absl::Status CheckCaFile(const std::string& ca_file) {
  const auto pem = ReadSecretFile(ca_file, "CA file");
  if (!pem.ok()) return absl::InvalidArgumentError(pem.status().message());
  return CheckCaText(*pem, ca_file, absl::Now());
}

struct CertificateAuthority::Store {
  X509_STORE* store = X509_STORE_new();
  ~Store() { X509_STORE_free(store); }
};

CertificateAuthority::CertificateAuthority(std::unique_ptr<Store> store)
    : store_(std::move(store)) {}
CertificateAuthority::~CertificateAuthority() = default;

absl::StatusOr<std::unique_ptr<CertificateAuthority>> CertificateAuthority::Load(
    const std::string& ca_file) {
  const auto pem = ReadSecretFile(ca_file, "CA file");
  if (!pem.ok()) return absl::InvalidArgumentError(pem.status().message());
  return FromText(*pem, ca_file);
}

absl::StatusOr<std::unique_ptr<CertificateAuthority>> CertificateAuthority::FromText(
    absl::string_view pem, absl::string_view name) {
  ASYMPO_RETURN_IF_ERROR(CheckCaText(pem, name, absl::Now()));
  auto store = std::make_unique<Store>();
  int n = 0;
  for (X509Ptr& cert : ReadCertificates(pem)) {
    if (X509_STORE_add_cert(store->store, cert.get()) == 1) ++n;
  }
  ERR_clear_error();
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat("CA file ", name, " holds no PEM certificate"));
  }
  return std::unique_ptr<CertificateAuthority>(new CertificateAuthority(std::move(store)));
}

absl::StatusOr<CertificateIdentity> CertificateAuthority::Verify(absl::string_view leaf,
                                                                 absl::string_view chain,
                                                                 absl::Time now) const {
  std::vector<X509Ptr> leaf_certs = ReadCertificates(leaf);
  if (leaf_certs.empty()) {
    return absl::UnauthenticatedError("the client certificate does not parse");
  }
  X509* cert = leaf_certs.front().get();
  std::unique_ptr<STACK_OF(X509), StackFree> untrusted(sk_X509_new_null());
  for (X509Ptr& c : ReadCertificates(chain)) sk_X509_push(untrusted.get(), c.release());
  std::unique_ptr<X509_STORE_CTX, CtxFree> ctx(X509_STORE_CTX_new());
  if (ctx == nullptr || X509_STORE_CTX_init(ctx.get(), store_->store, cert, untrusted.get()) != 1) {
    return absl::InternalError("cannot set up certificate verification");
  }
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  X509_VERIFY_PARAM_set_time(param, absl::ToTimeT(now));
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    const std::string fault = ValidityFault(cert, absl::ToTimeT(now));
    if (err == X509_V_ERR_CERT_HAS_EXPIRED || err == X509_V_ERR_CERT_NOT_YET_VALID) {
      return absl::UnauthenticatedError(absl::StrCat("the client certificate ", fault));
    }
    return absl::UnauthenticatedError(absl::StrCat("the client certificate is not trusted: ",
                                                   X509_verify_cert_error_string(err)));
  }
  return IdentityOf(cert);
}

}  // namespace asympo::security
