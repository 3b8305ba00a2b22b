"""Readings of numbers, units and alphanumeric words (hayakoe_pi.text.readings)."""

from __future__ import annotations

import re
import unicodedata

import pytest

from conftest import GOLDEN as GOLDEN_DIR
from hayakoe_pi.text.numbers import number_to_kanji
from hayakoe_pi.text.readings import expand_readings

GOLDEN = GOLDEN_DIR / "readings_public.tsv"  # under $HAYAKOE_PI_SHARED (default ../shared)


def nfkc(s: str) -> str:
    return unicodedata.normalize("NFKC", s)


def expand(s: str) -> str:
    return expand_readings(nfkc(s))


# --- the public golden rows -------------------------------------------------


def _golden_rows():
    if not GOLDEN.is_file():
        return []
    rows = []
    for line in GOLDEN.read_text(encoding="utf-8").splitlines():
        if line.strip():
            raw, want = line.split("\t")
            rows.append(pytest.param(raw, want, id=raw))
    return rows


@pytest.mark.skipif(not GOLDEN.is_file(), reason=f"{GOLDEN} not present")
@pytest.mark.parametrize("raw,want", _golden_rows())
def test_public_golden(raw, want):
    assert expand(raw) == nfkc(want)


# --- num2words-compatible numbers (values taken from num2words(lang="ja")) ---

NUM2WORDS_JA = [
    ("0", "零"),
    ("1", "一"),
    ("7", "七"),
    ("10", "十"),
    ("11", "十一"),
    ("19", "十九"),
    ("20", "二十"),
    ("99", "九十九"),
    ("100", "百"),
    ("101", "百一"),
    ("110", "百十"),
    ("111", "百十一"),
    ("200", "二百"),
    ("999", "九百九十九"),
    ("1000", "千"),
    ("1001", "千一"),
    ("1010", "千十"),
    ("1100", "千百"),
    ("2000", "二千"),
    ("2027", "二千二十七"),
    ("1999", "千九百九十九"),
    ("4560", "四千五百六十"),
    ("9999", "九千九百九十九"),
    ("10000", "一万"),
    ("10001", "一万一"),
    ("11000", "一万千"),
    ("12345", "一万二千三百四十五"),
    ("20000", "二万"),
    ("99999", "九万九千九百九十九"),
    ("100000", "十万"),
    ("1000000", "百万"),
    ("10000000", "千万"),
    ("12000000", "千二百万"),
    ("100000000", "一億"),
    ("100000001", "一億一"),
    ("123456789", "一億二千三百四十五万六千七百八十九"),
    ("1000000000000", "一兆"),
    ("1000000000001", "一兆一"),
    ("9007199254740993", "九千七兆千九百九十二億五千四百七十四万九百九十三"),
    ("0.5", "零点五"),
    ("0.05", "零点零五"),
    ("0.8", "零点八"),
    ("1.0", "一"),
    ("1.50", "一点五"),
    ("10.00", "十"),
    ("21.5", "二十一点五"),
    ("52.34", "五十二点三四"),
    ("99.99", "九十九点九九"),
    ("3.14159", "三点一四一五九"),
    ("100.001", "百点零零一"),
    ("0.000", "零"),
    ("007", "七"),
    ("1,000", "千"),
    ("4,560", "四千五百六十"),
    ("1,234,567", "百二十三万四千五百六十七"),
]


@pytest.mark.parametrize("number,want", NUM2WORDS_JA)
def test_number_to_kanji_matches_num2words(number, want):
    assert number_to_kanji(number) == want


@pytest.mark.parametrize("number,want", [n for n in NUM2WORDS_JA if len(n[0].replace(",", "")) < 17])
def test_plain_numbers_in_text_read_like_num2words(number, want):
    assert expand(f"数値は{number}です") == f"数値は{want}です"


def test_number_to_kanji_sign_and_errors():
    assert number_to_kanji("-3") == "マイナス三"
    assert number_to_kanji("+3") == "三"
    with pytest.raises(ValueError):
        number_to_kanji("3a")
    with pytest.raises(ValueError):
        number_to_kanji("")


def test_number_to_kanji_powers_of_ten_use_myriad_names():
    assert number_to_kanji("1" + "0" * 16) == "一京"
    assert number_to_kanji("1" + "0" * 20) == "一垓"
    assert number_to_kanji("2" + "0" * 48) == "二極"


# --- our own cases, by category ---------------------------------------------

CASES = [
    # temperature and signs
    ("外気温は−2°Cです。", "外気温はマイナス二度です。"),
    ("外気温は－3℃です。", "外気温はマイナス三度です。"),
    ("気温:-3℃", "気温:マイナス三度"),
    ("気温は+3℃上昇", "気温はプラス三度上昇"),
    ("誤差は±0.5℃です", "誤差はプラスマイナス零点五度です"),
    ("気温-5度", "気温マイナス五度"),
    ("マイナス5度", "マイナス五度"),
    ("25.0℃", "二十五度"),
    ("21.5 °C", "二十一点五度"),
    ("華氏70°Fです", "華氏七十度です"),
    ("外は70°Fです", "外は華氏七十度です"),
    ("角度は90°です", "角度は九十度です"),
    # ranges
    ("今日は10〜20℃の予報です。", "今日は十から二十度の予報です。"),
    ("湿度は40-60%が快適です。", "湿度は四十から六十パーセントが快適です。"),
    ("最高気温は25℃〜30℃です", "最高気温は二十五度から三十度です"),
    ("10℃-20℃", "十度から二十度"),
    ("明日は-5〜-3℃です", "明日はマイナス五からマイナス三度です"),
    ("3〜5人", "三から五人"),
    ("10時〜12時", "十時から十二時"),
    ("10:00〜12:00", "十時から十二時"),
    ("風速は8〜10m/sです", "風速は秒速八から十メートルです"),
    ("¥100〜¥200", "百から二百円"),
    # percentages
    ("60 %", "六十パーセント"),
    ("50%OFFです", "五十パーセントオフです"),
    ("成功率は99.9%です", "成功率は九十九点九パーセントです"),
    # times
    ("7:30に起きます", "七時三十分に起きます"),
    ("14:00から会議", "十四時から会議"),
    ("8:05です", "八時五分です"),
    ("7:30:15に開始", "七時三十分十五秒に開始"),
    ("0:00になりました", "零時になりました"),
    ("23:59です", "二十三時五十九分です"),
    ("午前7時に起こして", "午前七時に起こして"),
    ("午後7:30に", "午後七時三十分に"),
    ("7:30 PMに", "午後七時三十分に"),
    ("AM 6:15", "午前六時十五分"),
    ("7amに起こして", "午前七時に起こして"),
    ("1h30mかかります", "一時間三十分かかります"),
    ("5m30sかかります", "五分三十秒かかります"),
    # dates
    ("3月14日", "三月十四日"),
    ("2026/12/2に届きます", "二千二十六年十二月二日に届きます"),
    ("2026-12-02です", "二千二十六年十二月二日です"),
    ("2026.12.02", "二千二十六年十二月二日"),
    ("2026/4に", "二千二十六年四月に"),
    ("12/25はクリスマス", "十二月二十五日はクリスマス"),
    ("12/31(土)", "十二月三十一日土曜日"),  # the weekday read, its brackets gone (no pause)
    ("1/2(金)", "一月二日金曜日"),
    ("5/10", "五月十日"),
    ("2026-12-02T14:30:00に実行", "二千二十六年十二月二日十四時三十分に実行"),
    ("1999年", "千九百九十九年"),
    # fractions and ratios
    ("1/2の確率", "二分の一の確率"),
    ("3/4くらい残っています", "四ぶんの三くらい残っています"),
    ("1/10程度", "十分の一程度"),
    ("1/2カップ", "二分の一カップ"),
    ("3/50", "五十ぶんの三"),
    ("画面比は16:9です", "画面比は十六対九です"),
    ("血圧は120/80mmHgです", "血圧は百二十の八十ミリメートルエイチジーです"),
    # money
    ("¥1,000です", "千円です"),
    ("￥1000です", "千円です"),
    ("$5です", "五ドルです"),
    ("€20です", "二十ユーロです"),
    ("£3です", "三ポンドです"),
    ("100€", "百ユーロ"),
    ("¥1,000円です", "千円です"),
    ("$5円", "五ドル円"),
    ("1万円", "一万円"),
    ("1.5万円", "一点五万円"),
    ("単価は31円/kWhです", "単価は三十一円パーキロワットアワーです"),
    # units
    ("消費電力は1500Wです", "消費電力は千五百ワットです"),
    ("0.8 kW", "零点八キロワット"),
    ("100Vの電源", "百ボルトの電源"),
    ("5Aまで", "五アンペアまで"),
    ("10mAの電流", "十ミリアンペアの電流"),
    ("5000mAhのバッテリー", "五千ミリアンペアアワーのバッテリー"),
    ("50Hzの地域", "五十ヘルツの地域"),
    ("2.4GHzの帯域", "二点四ギガヘルツの帯域"),
    ("時速60km/hで", "時速六十キロメートルで"),
    ("100kmの距離", "百キロメートルの距離"),
    ("3cmの雪", "三センチメートルの雪"),
    ("10mmの雨", "十ミリメートルの雨"),
    ("1.5Lのペットボトル", "一点五リットルのペットボトル"),
    ("500mlの水", "五百ミリリットルの水"),
    ("2.5mLの薬", "二点五ミリリットルの薬"),
    ("100gの肉", "百グラムの肉"),
    ("5mgの錠剤", "五ミリグラムの錠剤"),
    ("PM2.5の濃度は35μg/m3です", "ピーエムニーテンゴの濃度は三十五マイクログラムパー立方メートルです"),
    ("PM2.5は35µg/m³です", "ピーエムニーテンゴは三十五マイクログラムパー立方メートルです"),
    ("部屋の広さは20m2です", "部屋の広さは二十平方メートルです"),
    ("部屋の広さは20㎡です", "部屋の広さは二十平方メートルです"),
    ("5GBの空き容量", "五ギガバイトの空き容量"),
    ("100Mbpsで接続", "百メガビーピーエスで接続"),
    ("応答時間は20msです", "応答時間は二十ミリ秒です"),
    ("騒音は45dBです", "騒音は四十五デシベルです"),
    ("照度は300lxです", "照度は三百ルクスです"),
    ("気圧は1013hPaです", "気圧は千十三ヘクトパスカルです"),
    ("CO2濃度は1,200ppmです", "シーオーツー濃度は千二百ピーピーエムです"),
    ("色温度は2700Kです", "色温度は二千七百ケルビンです"),
    ("24hで", "二十四時間で"),
    ("30sごとに", "三十秒ごとに"),
    ("5minで", "五分で"),
    ("2Fの寝室", "二階の寝室"),
    ("B1Fの駐車場", "地下一階の駐車場"),
    # known words and acronyms
    ("USB3で接続", "ユーエスビースリーで接続"),
    ("USB3.0のポート", "ユーエスビースリーポイントゼロのポート"),
    ("USB-Cケーブル", "ユーエスビーシーケーブル"),
    ("Wi-Fiに接続しました", "ワイファイに接続しました"),
    ("WiFiが切れました", "ワイファイが切れました"),
    ("wifiの電波", "ワイファイの電波"),
    ("Bluetoothをオンにしました", "ブルートゥースをオンにしました"),
    ("AIが判断します", "エーアイが判断します"),
    ("IoT家電", "アイオーティー家電"),
    ("TVをつけて", "テレビをつけて"),  # OpenJTalk's dictionary, as the reference reads it
    ("PCを起動", "ピーシーを起動"),
    ("HDMIケーブル", "エイチディーエムアイケーブル"),
    ("CPU温度は55℃です", "シーピーユー温度は五十五度です"),
    ("GPSで位置を確認", "ジーピーエスで位置を確認"),
    ("IDを入力", "アイディーを入力"),
    ("OKです", "オーケーです"),  # K is ケー, as broadcasters say it
    ("NHKをつけて", "エヌエイチケーをつけて"),
    ("Alexa、電気をつけて", "アレクサ、電気をつけて"),
    ("Googleで検索", "グーグルで検索"),
    ("iPhoneを充電", "アイフォーンを充電"),
    ("Home Assistantが再起動しました", "ホームアシスタントが再起動しました"),
    ("HomeAssistantが再起動しました", "ホームアシスタントが再起動しました"),
    ("エアコンをONにしました", "エアコンをオンにしました"),
    ("照明をOFFにしました", "照明をオフにしました"),
    ("Ecoモードです", "エコモードです"),
    ("NO2とCO2", "エヌオーツーとシーオーツー"),
    ("MP3を再生", "エムピースリーを再生"),
    ("4Kテレビ", "ヨンケーテレビ"),
    ("5Gに接続", "ファイブジーに接続"),
    ("3LDKの部屋", "三エルディーケーの部屋"),
    ("ABC12", "エイビーシー十二"),
    ("XQZ", "エックスキューゼット"),  # unknown to the dictionary: spelled
    # plain numbers, ordinals, multiplication, codes
    ("3つあります", "三つあります"),
    ("2回押してください", "二回押してください"),
    ("第1位です", "第一位です"),
    ("1stステージ", "ファーストステージ"),
    ("1920×1080の解像度", "千九百二十かける千八十の解像度"),
    ("1920x1080の解像度", "千九百二十かける千八十の解像度"),
    ("今日の歩数は8,523歩です", "今日の歩数は八千五百二十三歩です"),
    ("電話番号は090-1234-5678です", "電話番号はゼロキューゼロのイチニーサンヨンのゴーロクナナハチです"),
    ("番号は0120123456です", "番号はゼロイチニーゼロイチニーサンヨンゴーロクです"),
    ("〒100-0001", "郵便番号イチゼロゼロのゼロゼロゼロイチ"),
    ("12345678901234567", "イチニーサンヨンゴーロクナナハチキューゼロイチニーサンヨンゴーロクナナ"),
    ("バージョン2024.12.1に更新", "バージョン二千二十四点十二点一に更新"),
    ("v1.2.3に更新", "バージョン一点二点三に更新"),
    ("IPアドレスは192.168.1.10です", "アイピーアドレスは百九十二点百六十八点一点十です"),
    # a whole announcement
    (
        "この部屋は25.5℃、湿度55%、CO2は650ppmです。",
        "この部屋は二十五点五度、湿度五十五パーセント、シーオーツーは六百五十ピーピーエムです。",
    ),
]


@pytest.mark.parametrize("raw,want", CASES, ids=[c[0] for c in CASES])
def test_cases(raw, want):
    assert expand(raw) == want


# Weekdays in brackets after a date, fractions against dates, K, product names
# (issue 16): sentences of our own, with the cases where the other reading is right.
READ_AS_SAID = [
    ("1月9日(金)は燃えるゴミの日です", "一月九日金曜日は燃えるゴミの日です"),
    ("次の収集は12月1日(月)です", "次の収集は十二月一日月曜日です"),
    ("5/3(祝)は休館", "五月三日祝日は休館"),
    ("3月20日（土・祝）", "三月二十日土曜日祝日"),
    ("1/9(金)", "一月九日金曜日"),
    ("会議室(金)", "会議室(金)"),  # no date before: the bracket stays
    ("タンクの水は3/4です", "タンクの水は四ぶんの三です"),
    ("残りは1/2です", "残りは二分の一です"),
    ("3/4の予定は会議です", "三月四日の予定は会議です"),
    ("3/4から工事です", "三月四日から工事です"),
    ("次回は1/2です", "次回は一月二日です"),
    ("期限は2/3です", "期限は二月三日です"),
    ("3/4〜3/10は休み", "三月四日から三月十日は休み"),
    ("1/4程度", "四ぶんの一程度"),
    ("7/15は晴れ", "七月十五日は晴れ"),  # not a common fraction: a date
    ("OKボタン", "オーケーボタン"),
    ("2DKの部屋", "二ディーケーの部屋"),
    ("KDDIの回線", "ケーディーディーアイの回線"),
    ("NHK", "エヌエイチケー"),
    ("4Kテレビ", "ヨンケーテレビ"),
]


@pytest.mark.parametrize("raw,want", READ_AS_SAID, ids=[c[0] for c in READ_AS_SAID])
def test_read_as_said(raw, want):
    assert expand(raw) == want


PRODUCT_NAMES = [
    ("Fire Stickを起動します", "ファイアスティックを起動します"),
    ("Nest Miniが応答しません", "ネストミニが応答しません"),
    ("Echo Dotの音量を上げます", "エコードットの音量を上げます"),
    ("SwitchBot Hub Miniがオフラインです", "スイッチボットハブミニがオフラインです"),
    ("Hue Bridgeにつながりません", "ヒューブリッジにつながりません"),
    ("AirPods Proの電池が少なくなっています", "エアーポッズプロの電池が少なくなっています"),
    ("Ring Doorbellが押されました", "リングドアベルが押されました"),
    ("Apple Watchを充電してください", "アップルウォッチを充電してください"),
    ("Nature Remoの温度は20℃です", "ネイチャーリモの温度は二十度です"),
    # capitals are an acronym, spelled; known acronyms as before
    ("HUBの電源", "エイチユービーの電源"),
    ("LEDが点灯しました", "エルイーディーが点灯しました"),
    ("USB3で接続", "ユーエスビースリーで接続"),
]


@pytest.mark.parametrize("raw,want", PRODUCT_NAMES, ids=[c[0] for c in PRODUCT_NAMES])
def test_english_words_in_product_names_are_read_as_words(raw, want):
    from hayakoe_pi.text.normalize import normalize_text

    assert normalize_text(raw) == want


LAYOUT = [
    # a colon, a slash or a bar between labelled values, and a bullet, are pauses (、 → ,)
    ("電源: オフ", "電源,オフ"),
    ("電源：オフ", "電源,オフ"),
    ("CPU温度 55℃ / ファン 1200rpm", "シーピーユー温度五十五度,ファン千二百アールピーエム"),
    ("温度 | 湿度", "温度,湿度"),
    ("晴れ/曇り", "晴れ,曇り"),
    ("・洗濯機: 終了", "洗濯機,終了"),
    ("・洗濯機: 終了\n・乾燥機: 運転中", "洗濯機,終了.乾燥機,運転中"),
    ("- 玄関: 施錠\n* 窓: 開", "玄関,施錠.窓,開"),
    ("時刻: 12:30", "時刻,十二時三十分"),
    # not a pause inside a time, a ratio, a date, a fraction, a unit or a URL
    ("12:30に", "十二時三十分に"),
    ("比率は16:9です", "比率は十六対九です"),
    ("2024/12/05", "二千二十四年十二月五日"),
    ("タンクの水は3/4です", "タンクの水は四ぶんの三です"),
    ("風速は12m/sです", "風速は秒速十二メートルです"),
    ("営業は24/7です", "営業はトゥエンティーフォーセブンです"),
]


@pytest.mark.parametrize("raw,want", LAYOUT, ids=[c[0] for c in LAYOUT])
def test_layout_marks_are_pauses(raw, want):
    from hayakoe_pi.text.normalize import normalize_text

    assert normalize_text(raw) == want


def test_no_pause_inside_a_url():
    from hayakoe_pi.text.layout import layout_pauses

    url = "https://example.com/a/b?c=1|2"
    assert layout_pauses(f"詳細: {url}") == f"詳細、{url}"


JAPANESE_NAMES = [
    # romaji read by its English spelling loses long vowels and hidden sounds
    ("Mazda", "マツダ"), ("Seiko", "セイコー"), ("Kyocera", "キョーセラ"), ("Fujitsu", "フジツー"),
    ("Sanyo", "サンヨー"), ("Shiseido", "シセイドー"), ("Noritz", "ノーリツ"), ("Balmuda", "バルミューダ"),
    ("Zojirushi", "ゾウジルシ"), ("Iris Ohyama", "アイリスオーヤマ"),
    # read right before, and still
    ("Shimano", "シマノ"), ("Daikin", "ダイキン"), ("Hitachi", "ヒタチ"), ("Nagoya", "ナゴヤ"),
    ("Hokkaido", "ホッカイドー"),
    # in a sentence, in capitals' company, in a camel-case name
    ("Zojirushiの炊飯器が炊き上がりました", "ゾウジルシの炊飯器が炊き上がりました"),
    ("SonyBraviaの電源", "ソニーブラビアの電源"),
]


@pytest.mark.parametrize("raw,want", JAPANESE_NAMES, ids=[c[0] for c in JAPANESE_NAMES])
def test_japanese_names_in_latin_letters(raw, want):
    from hayakoe_pi.text.normalize import normalize_text

    assert normalize_text(raw) == want


def test_every_japanese_name_is_katakana():
    from hayakoe_pi.text.english import JAPANESE_NAMES as NAMES
    from hayakoe_pi.text.kana import reading_problem

    assert len(NAMES) > 100
    assert all(name.isascii() and name.isalpha() and reading_problem(reading) is None
               for name, reading in NAMES.items())


# --- what must not change ---------------------------------------------------

PLAIN_JAPANESE = [
    "おはようございます。今日もいい天気ですね！",
    "リビングの電気を消しました。",
    "「洗濯が終わりました」と伝えてください……",
    "玄関の鍵が開いています？　確認してください。",
    "マイナス五度まで下がるでしょう〜",
    "午前中は雨、午後は晴れ。",
    "二酸化炭素の濃度が高くなっています・換気しましょう",
    "〇時〜一時（予定）",
]


@pytest.mark.parametrize("text", PLAIN_JAPANESE)
def test_plain_japanese_is_unchanged(text):
    assert expand_readings(text) == text
    assert expand_readings(nfkc(text)) == nfkc(text)


@pytest.mark.parametrize(
    "text",
    [
        "mの文字",
        "the light is on",
        "Aランクの部屋",
        "LEDs",
        "ABCDEFG",
        "Hello, world!",
    ],
)
def test_unknown_latin_is_left_alone(text):
    assert expand_readings(text) == text


def test_only_matched_spans_change():
    # Punctuation and the Japanese around a number stay byte for byte.
    assert expand("「室温」は、21.5℃（目安）…です！？") == nfkc("「室温」は、二十一点五度（目安）…です！？")
    assert expand("10時〜") == "十時〜"  # no number after the mark: not a range


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-02 14:30:05 室温21.5℃ 湿度45.5% 1,234円 -3℃ 3/4 16:9 0120-000-111",
        "USB3.0 PM2.5 10〜20m/s v2.0.1 ¥1,000〜¥2,000 1h30m 7:30PM 12/25(水)",
        "123456789012345678901234567890",
    ],
)
def test_no_digit_survives(text):
    assert not re.search(r"[0-9]", expand(text))
